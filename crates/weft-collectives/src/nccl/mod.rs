//! The NCCL backend (cargo feature `nccl`): one process per GPU, operations on a
//! communication stream of their own, ordered after the compute-stream work queued when they
//! were started, so gradient all-reduces overlap backward. A process that replays CUDA graphs
//! runs the operations outside its graphs on the compute stream instead
//! ([`crate::DeviceCollectives::set_eager_on_compute`]).
//!
//! Layers, as cudarc has them: [`handle`] (raw communicator over cudarc's `result`/`sys`
//! layers: init, split, async error, abort), [`launch`] (one checked NCCL call on device
//! buffers), [`staging`] (the backend's own device memory for host buffers),
//! [`engine`] and [`watchdog`] (the launcher and watchdog threads), `crate::peer_liveness`
//! (heartbeats through the rendezvous store), `crate::graph_mixing` (the wait NCCL asks for
//! when its graph mixing is off), [`ops`] (the [`DeviceCollectives`] and [`Communicator`]
//! implementations) and [`init`] (joining a job).
//!
//! Device memory goes straight to NCCL through [`DeviceCollectives`] (weft-parallel's tensor
//! collectives pick that path for tensors on this GPU); host buffers are copied to the GPU
//! and back. Point-to-point: NCCL pairs a send with the peer's
//! receive on the GPU, so two ranks that both `send` before they `recv` wait on each other —
//! use `send_recv` for exchanges.

mod engine;
mod handle;
mod init;
mod launch;
mod ops;
mod staging;
mod timing;
mod watchdog;

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaStream;

use crate::device::DeviceBuffer;
use crate::error::{CommError, Result};
use crate::peer_liveness::Liveness;
use engine::{Deliver, Engine, Init, Issue, Job};
use watchdog::Watchdog;

pub use init::init_nccl;

/// Settings of an NCCL communicator.
#[derive(Clone, Debug)]
pub struct NcclConfig {
    /// Longest time an operation may take before the watchdog aborts the communicator.
    pub timeout: Duration,
    /// The communication stream at the device's highest priority, so that its kernels take
    /// the SMs the compute stream's kernels free before the compute stream's next ones do
    /// (in a CUDA graph too, whose instantiation honours node priorities).
    pub high_priority_stream: bool,
    /// NCCL's support for graph-captured and eager operations outstanding together is on
    /// (its default). Off (`NCCL_GRAPH_MIXING_SUPPORT=0`, which `weft-run` sets), replayed
    /// steps run faster, and an operation issued outside a capture after one was captured
    /// first waits for the compute stream's queued work (`graph_mixing`).
    pub graph_mixing: bool,
}

impl Default for NcclConfig {
    fn default() -> Self {
        Self {
            timeout: crate::shm::DEFAULT_TIMEOUT,
            high_priority_stream: false,
            graph_mixing: true,
        }
    }
}

/// A communicator over NCCL for the ranks of one job, one GPU each.
pub struct NcclCommunicator {
    rank: usize,
    world_size: usize,
    /// The stream the model's kernels run on: operations start after its queued work.
    compute: Arc<CudaStream>,
    engine: Engine,
    liveness: Arc<Liveness>,
    /// Global (job) rank of each member, indexed by rank in this communicator.
    members: Vec<usize>,
    config: NcclConfig,
    /// Times the ordered operations for a timeline, when asked to.
    timer: timing::OpTimer,
    keep_alive: Vec<Box<dyn std::any::Any + Send + Sync>>,
}

impl NcclCommunicator {
    fn start(
        init: Init,
        compute: Arc<CudaStream>,
        (rank, members): (usize, Vec<usize>),
        liveness: Arc<Liveness>,
        config: NcclConfig,
    ) -> Result<Self> {
        let world_size = members.len();
        let (watch_liveness, watch_members, timeout, watch_context) = (
            liveness.clone(),
            members.clone(),
            config.timeout,
            compute.context().clone(),
        );
        let engine = Engine::start(
            init,
            compute.clone(),
            (rank, world_size),
            (
                config.timeout,
                config.high_priority_stream,
                config.graph_mixing,
            ),
            move |comm, health, flights| Watchdog {
                comm,
                context: watch_context,
                health,
                flights,
                liveness: watch_liveness,
                members: watch_members,
                timeout,
                rank,
            },
        )?;
        Ok(Self {
            rank,
            world_size,
            compute,
            engine,
            liveness,
            members,
            config,
            timer: timing::OpTimer::default(),
            keep_alive: Vec::new(),
        })
    }

    /// The GPU this rank's operations run on.
    pub fn ordinal(&self) -> usize {
        self.compute.context().ordinal()
    }

    /// The compute stream operations are ordered after.
    pub fn compute_stream(&self) -> &Arc<CudaStream> {
        &self.compute
    }

    fn keep_alive(&mut self, thing: Box<dyn std::any::Any + Send + Sync>) {
        self.keep_alive.push(thing);
    }

    fn check_rank(&self, op: &'static str, what: &'static str, value: usize) -> Result<()> {
        if value >= self.world_size || (what == "peer" && value == self.rank) {
            return Err(CommError::InvalidRank {
                op,
                what,
                value,
                rank: self.rank,
                world_size: self.world_size,
            });
        }
        Ok(())
    }

    /// Queues one operation after the work already on this thread's compute stream.
    fn submit(
        &self,
        op: &'static str,
        keep: Vec<DeviceBuffer>,
        issue: Issue,
        deliver: Deliver,
    ) -> Result<()> {
        self.submit_polled(op, keep, issue, deliver, (false, true))
    }

    /// [`Self::submit`], polled without back-off when `spin`; `calls_nccl` false for a job
    /// whose issue only marks a point of the stream (a fence).
    fn submit_polled(
        &self,
        op: &'static str,
        keep: Vec<DeviceBuffer>,
        issue: Issue,
        deliver: Deliver,
        (spin, calls_nccl): (bool, bool),
    ) -> Result<()> {
        self.engine.health.check(op)?;
        let ready = self
            .compute
            .record_event(None)
            .map_err(|e| engine::driver(op, self.rank, e))?;
        self.engine.submit(Job {
            op,
            ready,
            keep,
            issue,
            deliver,
            spin,
            calls_nccl,
        });
        Ok(())
    }
}

impl std::fmt::Debug for NcclCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NcclCommunicator(rank {} of {} on GPU {})",
            self.rank,
            self.world_size,
            self.ordinal()
        )
    }
}
