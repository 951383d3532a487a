//! The [`Communicator`] trait that every backend implements, and [`Work`], the handle of an
//! operation in flight.
//!
//! Operations are asynchronous: each call enqueues the operation and returns a [`Work`]
//! at once. Operations of one communicator run, and complete, in the order they were
//! issued (a stream, in CUDA terms); their handles may be waited in any order. Buffers are
//! moved in and handed back by [`Work::wait`], so nothing is borrowed while in flight.

use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;

use crate::buffer::Buffer;
use crate::device::DeviceCollectives;
use crate::element::Element;
use crate::error::{CommError, Result};
use crate::reduce_op::ReduceOp;

/// A group of ranks that run collective and point-to-point operations together.
///
/// Collectives must be called by every rank, in the same order, with matching arguments
/// (same element type and length; reduce-scatter inputs hold `world_size` shards).
/// `send`/`recv` pairs must be posted in the same order on both sides.
pub trait Communicator: Send + Sync {
    /// This process's rank, in `0..world_size()`.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn world_size(&self) -> usize;

    /// Name of the backend, such as `"shm"`.
    fn backend(&self) -> &'static str;

    /// Element-wise reduction of `buffer` across all ranks; every rank gets the result.
    fn all_reduce(&self, buffer: Buffer, op: ReduceOp) -> Work;

    /// Reduces `input` (`world_size` equal shards) across ranks; rank `r` gets the reduced
    /// shard `r`, a buffer of `input.len() / world_size` elements.
    fn reduce_scatter(&self, input: Buffer, op: ReduceOp) -> Work;

    /// Concatenates every rank's `input`, in rank order; every rank gets the whole.
    fn all_gather(&self, input: Buffer) -> Work;

    /// Every rank gets the contents of `root`'s `buffer` (same length on every rank).
    fn broadcast(&self, buffer: Buffer, root: usize) -> Work;

    /// Like [`Communicator::all_reduce`], but only `root` gets the result; the other ranks
    /// get their buffer back unchanged.
    fn reduce(&self, buffer: Buffer, op: ReduceOp, root: usize) -> Work;

    /// Sends `buffer` to `peer`, which must post a matching [`Communicator::recv`].
    /// Completes once the data is handed over (possibly before the peer has read it).
    fn send(&self, buffer: Buffer, peer: usize) -> Work;

    /// Receives the next message from `peer` into `buffer`, whose element type and length
    /// must match what the peer sends.
    fn recv(&self, buffer: Buffer, peer: usize) -> Work;

    /// Sends `send` to `to` while receiving the next message from `from` into `recv`, and
    /// yields the received buffer. Both transfers progress together, so ranks can exchange
    /// messages of any size (a ring shift, a pipeline hand-off) without ordering them.
    fn send_recv(&self, send: Buffer, to: usize, recv: Buffer, from: usize) -> Work;

    /// Completes when every rank has reached this barrier. Yields an empty `U8` buffer.
    fn barrier(&self) -> Work;

    /// Splits the ranks into groups (a collective over this communicator): ranks with the
    /// same `color` form one new communicator, ranked by `key`, then by rank here.
    fn split(&self, color: u32, key: i64) -> Result<Box<dyn Communicator>>;

    /// Operations straight on device memory, for backends that have them (NCCL); `None`
    /// for host-only backends such as shm. weft-parallel's tensor collectives use them for
    /// tensors on the backend's GPU and go through host buffers otherwise.
    fn device_collectives(&self) -> Option<&dyn DeviceCollectives> {
        None
    }
}

enum WorkState<T> {
    Pending(Receiver<Result<T>>),
    Done(Result<T>),
}

/// Handle of an operation in flight, yielding a host [`Buffer`] or, for device-native
/// operations ([`crate::DeviceCollectives`]), nothing (the output is the caller's memory). Dropping it does not cancel the
/// operation.
#[must_use = "an operation's result is only seen through its Work handle"]
pub struct Work<T = Buffer> {
    op: &'static str,
    rank: usize,
    state: WorkState<T>,
}

impl<T> Work<T> {
    /// A handle that completes when the backend sends the result on `receiver`.
    pub(crate) fn pending(op: &'static str, rank: usize, receiver: Receiver<Result<T>>) -> Self {
        Work {
            op,
            rank,
            state: WorkState::Pending(receiver),
        }
    }

    /// A handle that is already complete.
    pub(crate) fn done(op: &'static str, rank: usize, result: Result<T>) -> Self {
        Work {
            op,
            rank,
            state: WorkState::Done(result),
        }
    }

    /// Name of the operation, such as `"all_reduce"`.
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// Whether the operation has finished (successfully or not); never blocks.
    pub fn is_complete(&mut self) -> bool {
        if let WorkState::Pending(receiver) = &self.state {
            let result = match receiver.try_recv() {
                Ok(result) => result,
                Err(TryRecvError::Empty) => return false,
                Err(TryRecvError::Disconnected) => Err(self.gone()),
            };
            self.state = WorkState::Done(result);
        }
        true
    }

    /// Blocks until the operation completes and returns its buffer. Never hangs: every
    /// wait inside the backend is bounded by the communicator's timeout.
    pub fn wait(self) -> Result<T> {
        match self.state {
            WorkState::Done(result) => result,
            WorkState::Pending(ref receiver) => {
                receiver.recv().unwrap_or_else(|_| Err(self.gone()))
            }
        }
    }

    /// Like [`Work::wait`], but gives up after `timeout` with [`CommError::WaitTimeout`];
    /// the operation itself goes on, and later operations still run after it.
    pub fn wait_timeout(self, timeout: Duration) -> Result<T> {
        match self.state {
            WorkState::Done(result) => result,
            WorkState::Pending(ref receiver) => match receiver.recv_timeout(timeout) {
                Ok(result) => result,
                Err(RecvTimeoutError::Timeout) => Err(CommError::WaitTimeout {
                    op: self.op,
                    waited: timeout,
                }),
                Err(RecvTimeoutError::Disconnected) => Err(self.gone()),
            },
        }
    }

    fn gone(&self) -> CommError {
        CommError::WorkerGone {
            op: self.op,
            rank: self.rank,
        }
    }
}

impl Work<Buffer> {
    /// [`Work::wait`], then unwraps the buffer as a vector of `T`.
    pub fn wait_vec<T: Element>(self) -> Result<Vec<T>> {
        self.wait()?.into_vec()
    }
}

impl<T> std::fmt::Debug for Work<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            WorkState::Pending(_) => "pending",
            WorkState::Done(Ok(_)) => "done",
            WorkState::Done(Err(_)) => "failed",
        };
        write!(f, "Work({} on rank {}: {state})", self.op, self.rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn work_reports_completion_results_and_timeouts() {
        let (sender, receiver) = channel();
        let mut work = Work::pending("all_reduce", 0, receiver);
        assert!(!work.is_complete());
        sender.send(Ok(Buffer::from(vec![1u8]))).unwrap();
        assert!(work.is_complete());
        assert_eq!(work.wait_vec::<u8>().unwrap(), vec![1]);

        let (_sender, receiver) = channel::<Result<Buffer>>();
        let err = Work::pending("barrier", 1, receiver)
            .wait_timeout(Duration::from_millis(10))
            .unwrap_err();
        assert!(
            matches!(err, CommError::WaitTimeout { op: "barrier", .. }),
            "{err}"
        );

        let (sender, receiver) = channel::<Result<Buffer>>();
        drop(sender);
        let err = Work::pending("send", 2, receiver).wait().unwrap_err();
        assert!(
            matches!(
                err,
                CommError::WorkerGone {
                    op: "send",
                    rank: 2
                }
            ),
            "{err}"
        );
    }
}
