//! The watchdog thread of an NCCL communicator, in the spirit of PyTorch's
//! `TORCH_NCCL_ASYNC_ERROR_HANDLING`: it reports each operation's completion in issue order
//! and, while any is outstanding, polls `ncclCommGetAsyncError`, the per-operation timeout
//! and the peers' [`Liveness`]. On any failure it aborts the communicator, so nothing stays
//! blocked in NCCL, and fails every outstanding operation with an error naming the cause
//! (the dead rank, when one is found).

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaEvent};

use super::engine::{driver, Deliver, Health};
use super::handle::CommHandle;
use crate::device::DeviceBuffer;
use crate::error::{CommError, Result};
use crate::peer_liveness::Liveness;

/// An operation enqueued on the communication stream.
pub(crate) struct InFlight {
    pub op: &'static str,
    /// Recorded on the communication stream right after the operation.
    pub done: CudaEvent,
    pub keep: Vec<DeviceBuffer>,
    pub deliver: Deliver,
    pub launched: Instant,
    /// Poll by yielding for as long as it takes, not only for the first [`SPIN`].
    pub spin: bool,
}

/// For this long after the oldest outstanding operation was launched, completion is polled
/// by yielding the CPU (microsecond latency for small messages); after that by sleeping.
const SPIN: Duration = Duration::from_millis(2);
/// Sleep between polls once an operation has been outstanding longer than [`SPIN`].
const POLL: Duration = Duration::from_micros(50);
/// How often peers' liveness is checked while operations are outstanding.
const LIVENESS_EVERY: Duration = Duration::from_secs(1);

/// State of the watchdog thread.
pub(crate) struct Watchdog {
    pub comm: Arc<CommHandle>,
    /// The GPU's context, current on the watchdog thread: the buffers of finished operations
    /// may be freed there, and a free without a current context fails (cudarc records the
    /// error and the next CUDA call of any thread returns it).
    pub context: Arc<CudaContext>,
    pub health: Arc<Health>,
    pub flights: Receiver<InFlight>,
    pub liveness: Arc<Liveness>,
    /// Global ranks of this communicator's members, for liveness checks.
    pub members: Vec<usize>,
    pub timeout: Duration,
    pub rank: usize,
}

impl Watchdog {
    pub fn spawn(self, rank: usize) -> Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name(format!("weft-nccl-watchdog-{rank}"))
            .spawn(move || self.run())
            .map_err(|e| CommError::io("spawning the NCCL watchdog thread", e))
    }

    fn run(self) {
        if let Err(e) = self.context.bind_to_thread() {
            self.health
                .fail(driver("watchdog bind_to_thread", self.rank, e), &self.comm);
        }
        let mut queue: VecDeque<InFlight> = VecDeque::new();
        let mut open = true;
        let mut last_liveness = Instant::now();
        while open || !queue.is_empty() {
            let next = if queue.is_empty() {
                match self.flights.recv_timeout(Duration::from_millis(100)) {
                    Ok(flight) => Some(flight),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => {
                        open = false;
                        None
                    }
                }
            } else {
                match self.flights.try_recv() {
                    Ok(flight) => Some(flight),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        None
                    }
                }
            };
            if let Some(flight) = next {
                queue.push_back(flight);
                continue;
            }
            if let Err(error) = self.complete_finished(&mut queue) {
                self.fail_all(&mut queue, error);
                continue;
            }
            let Some(front) = queue.front() else {
                continue;
            };
            let spinning = front.spin || front.launched.elapsed() < SPIN;
            if let Some(error) = self.check_health(front, &mut last_liveness) {
                self.fail_all(&mut queue, error);
                continue;
            }
            if spinning {
                std::thread::yield_now();
            } else {
                std::thread::sleep(POLL);
            }
        }
    }

    /// Delivers, in issue order, every operation whose completion event has fired.
    fn complete_finished(&self, queue: &mut VecDeque<InFlight>) -> Result<()> {
        while let Some(front) = queue.front() {
            let finished = front
                .done
                .try_is_complete()
                .map_err(|e| driver(front.op, self.rank, e))?;
            if !finished {
                break;
            }
            let flight = queue.pop_front().expect("front exists");
            drop(flight.keep);
            (flight.deliver)(Ok(()));
        }
        Ok(())
    }

    /// An error when NCCL reported one, the oldest operation timed out, or a peer died.
    fn check_health(&self, oldest: &InFlight, last_liveness: &mut Instant) -> Option<CommError> {
        if let Err(error) = self.comm.async_error() {
            return Some(error);
        }
        if last_liveness.elapsed() >= LIVENESS_EVERY {
            *last_liveness = Instant::now();
            if let Some(death) = self.liveness.first_dead(&self.members) {
                return Some(CommError::PeerDied {
                    rank: death.rank,
                    pid: death.pid,
                    op: oldest.op,
                    reason: death.reason,
                });
            }
        }
        let waited = oldest.launched.elapsed();
        (waited > self.timeout).then(|| CommError::Timeout {
            op: oldest.op,
            waited,
            missing: Vec::new(),
        })
    }

    /// Fails every outstanding operation with `error`, then aborts the communicator: the
    /// waiters get their error first, since the abort may wait for kernels that a dead peer
    /// never lets finish (NCCL kernels inside a replayed CUDA graph).
    fn fail_all(&self, queue: &mut VecDeque<InFlight>, error: CommError) {
        self.health.record(error.clone());
        for flight in queue.drain(..) {
            (flight.deliver)(Err(error.clone()));
        }
        self.comm.abort();
    }
}
