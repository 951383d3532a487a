//! A communicator's progress thread: a FIFO of tasks that run one after another on an
//! engine owned by the thread, so operations complete in the order they were issued.

use std::sync::mpsc::{channel, Sender};
use std::thread::{self, JoinHandle};

use crate::buffer::Buffer;
use crate::communicator::Work;
use crate::error::{CommError, Result};

type Task<E> = Box<dyn FnOnce(&mut E) + Send>;

/// Owns the progress thread; dropping it runs the remaining tasks, then joins the thread.
pub(crate) struct WorkQueue<E> {
    rank: usize,
    sender: Option<Sender<Task<E>>>,
    thread: Option<JoinHandle<()>>,
}

impl<E: Send + 'static> WorkQueue<E> {
    /// Starts a thread named `name` that owns `engine`.
    pub(crate) fn spawn(name: String, rank: usize, mut engine: E) -> Result<Self> {
        let (sender, receiver) = channel::<Task<E>>();
        let thread = thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                for task in receiver {
                    task(&mut engine);
                }
            })
            .map_err(|e| CommError::io(format!("starting progress thread {name}"), e))?;
        Ok(WorkQueue {
            rank,
            sender: Some(sender),
            thread: Some(thread),
        })
    }

    /// Enqueues `task`; its result completes the returned [`Work`].
    pub(crate) fn submit<F>(&self, op: &'static str, task: F) -> Work
    where
        F: FnOnce(&mut E) -> Result<Buffer> + Send + 'static,
    {
        let (result_sender, receiver) = channel();
        let queued = self.enqueue(Box::new(move |engine: &mut E| {
            // The receiver may be gone when the caller dropped the Work handle.
            let _ = result_sender.send(task(engine));
        }));
        if queued {
            Work::pending(op, self.rank, receiver)
        } else {
            Work::done(op, self.rank, Err(self.gone(op)))
        }
    }

    /// Enqueues `task` and blocks until it has run.
    pub(crate) fn call<R, F>(&self, op: &'static str, task: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&mut E) -> Result<R> + Send + 'static,
    {
        let (result_sender, receiver) = channel();
        let queued = self.enqueue(Box::new(move |engine: &mut E| {
            let _ = result_sender.send(task(engine));
        }));
        if !queued {
            return Err(self.gone(op));
        }
        receiver.recv().unwrap_or_else(|_| Err(self.gone(op)))
    }

    fn enqueue(&self, task: Task<E>) -> bool {
        self.sender
            .as_ref()
            .is_some_and(|sender| sender.send(task).is_ok())
    }

    fn gone(&self, op: &'static str) -> CommError {
        CommError::WorkerGone {
            op,
            rank: self.rank,
        }
    }
}

impl<E> Drop for WorkQueue<E> {
    fn drop(&mut self) {
        drop(self.sender.take());
        if let Some(thread) = self.thread.take() {
            // A panic in a task has already been reported by the thread itself.
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn tasks_run_in_order_and_handles_can_be_waited_out_of_order() {
        let queue = WorkQueue::spawn("test-queue".into(), 0, Vec::<u8>::new()).unwrap();
        let works: Vec<Work> = (0..5u8)
            .map(|i| {
                queue.submit("push", move |log: &mut Vec<u8>| {
                    std::thread::sleep(Duration::from_millis(2));
                    log.push(i);
                    Ok(Buffer::from(log.clone()))
                })
            })
            .collect();
        let mut results: Vec<Vec<u8>> = works
            .into_iter()
            .rev()
            .map(|w| w.wait_vec::<u8>().unwrap())
            .collect();
        results.reverse();
        for (i, log) in results.iter().enumerate() {
            assert_eq!(*log, (0..=i as u8).collect::<Vec<_>>());
        }
        let length = queue
            .call("len", |log: &mut Vec<u8>| Ok(log.len()))
            .unwrap();
        assert_eq!(length, 5);
    }

    #[test]
    fn a_panicking_task_fails_its_work_and_later_ones() {
        let queue = WorkQueue::spawn("test-panic".into(), 3, ()).unwrap();
        let work = queue.submit("boom", |_: &mut ()| panic!("task panicked on purpose"));
        assert!(matches!(
            work.wait(),
            Err(CommError::WorkerGone { rank: 3, .. })
        ));
        let later = queue.submit("after", |_: &mut ()| Ok(Buffer::from(vec![0u8])));
        assert!(matches!(later.wait(), Err(CommError::WorkerGone { .. })));
    }
}
