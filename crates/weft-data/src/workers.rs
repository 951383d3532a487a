//! The background half of `DataLoader`: worker threads that build batches by
//! number, a bounded window of batches in flight, and a reorder buffer so
//! batches come out in order whatever the worker timing.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use crate::batch::BatchSource;
use crate::{Batch, DataError};

type BatchResult = (usize, Result<Batch, DataError>);

/// A pool of worker threads building batches of one epoch ahead of the consumer.
///
/// At most `window` batches are dispatched but not yet taken, and both
/// channels hold `window` messages, so workers never block on a send.
#[derive(Debug)]
pub(crate) struct Workers {
    jobs: Option<Sender<usize>>,
    results: Receiver<BatchResult>,
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<()>>,
    reorder: BTreeMap<usize, Result<Batch, DataError>>,
    next_dispatch: usize,
    window: usize,
    num_batches: usize,
}

impl Workers {
    /// Starts `num_workers` threads and dispatches the first `window` batches.
    pub fn spawn(
        source: Arc<BatchSource>,
        num_workers: usize,
        window: usize,
    ) -> Result<Self, DataError> {
        let (job_sender, job_receiver) = crossbeam_channel::bounded(window);
        let (result_sender, result_receiver) = crossbeam_channel::bounded(window);
        let mut workers = Self {
            jobs: Some(job_sender),
            results: result_receiver,
            stop: Arc::new(AtomicBool::new(false)),
            handles: Vec::with_capacity(num_workers),
            reorder: BTreeMap::new(),
            next_dispatch: 0,
            window,
            num_batches: source.num_batches(),
        };
        for worker in 0..num_workers {
            let (source, jobs, results) =
                (source.clone(), job_receiver.clone(), result_sender.clone());
            let stop = workers.stop.clone();
            let handle = std::thread::Builder::new()
                .name(format!("weft-data-worker-{worker}"))
                .spawn(move || work(&source, &jobs, &results, &stop))
                .map_err(|source| DataError::SpawnWorker { worker, source })?;
            workers.handles.push(handle);
        }
        workers.dispatch_until(window);
        Ok(workers)
    }

    /// Sends jobs until batches `..end` (capped at the epoch's end) are dispatched.
    fn dispatch_until(&mut self, end: usize) {
        let end = end.min(self.num_batches);
        let Some(jobs) = &self.jobs else { return };
        while self.next_dispatch < end {
            // A failed send means every worker is gone; `take` reports it.
            if jobs.send(self.next_dispatch).is_err() {
                return;
            }
            self.next_dispatch += 1;
        }
    }

    /// Waits for batch `batch` (the next one in order) and tops the window up.
    pub fn take(&mut self, batch: usize) -> Result<Batch, DataError> {
        self.dispatch_until(batch + self.window);
        loop {
            if let Some(result) = self.reorder.remove(&batch) {
                return result;
            }
            match self.results.recv() {
                Ok((index, result)) => {
                    self.reorder.insert(index, result);
                }
                Err(_) => return Err(DataError::WorkersGone { batch }),
            }
        }
    }
}

/// A worker's loop: build each requested batch (turning a panic into an
/// error) until the job channel closes, the consumer leaves or `stop` is set.
fn work(
    source: &BatchSource,
    jobs: &Receiver<usize>,
    results: &Sender<BatchResult>,
    stop: &AtomicBool,
) {
    while let Ok(batch) = jobs.recv() {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let result =
            catch_unwind(AssertUnwindSafe(|| source.build(batch))).unwrap_or_else(|payload| {
                let message = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".to_string());
                Err(DataError::WorkerPanicked { batch, message })
            });
        if results.send((batch, result)).is_err() {
            return;
        }
    }
}

impl Drop for Workers {
    /// Stops the workers (each finishes at most the batch it is building) and joins them.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.jobs = None;
        drop(std::mem::replace(
            &mut self.results,
            crossbeam_channel::never(),
        ));
        for handle in self.handles.drain(..) {
            // Worker panics are caught inside `work`; a join error cannot carry more information.
            let _ = handle.join();
        }
    }
}
