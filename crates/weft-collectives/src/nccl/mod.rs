//! The NCCL backend (cargo feature `nccl`): one process per GPU, operations on a
//! communication stream of their own, ordered after the compute-stream work queued when they
//! were started, so gradient all-reduces overlap backward.
//!
//! Layers, as cudarc has them: [`handle`] (raw communicator over cudarc's `result`/`sys`
//! layers: init, split, async error, abort), [`launch`] (one checked NCCL call on tensors),
//! [`engine`] and [`watchdog`] (the launcher and watchdog threads), `crate::peer_liveness`
//! (heartbeats through the rendezvous store), [`ops`] (the [`DeviceCollectives`] and [`Communicator`]
//! implementations) and [`init`] (joining a job).
//!
//! Device tensors go straight to NCCL ([`crate::TensorCollectives`] picks that path); host
//! buffers are copied to the GPU and back. Point-to-point: NCCL pairs a send with the peer's
//! receive on the GPU, so two ranks that both `send` before they `recv` wait on each other —
//! use `send_recv` for exchanges.

mod engine;
mod handle;
mod init;
mod launch;
mod ops;
mod watchdog;

use std::sync::Arc;
use std::time::Duration;

use candle_core::op::BackpropOp;
use candle_core::{CudaStorage, DType as CandleDType, Device, Storage, Tensor};

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
}

impl Default for NcclConfig {
    fn default() -> Self {
        Self {
            timeout: crate::shm::DEFAULT_TIMEOUT,
        }
    }
}

/// A communicator over NCCL for the ranks of one job, one GPU each.
pub struct NcclCommunicator {
    rank: usize,
    world_size: usize,
    device: Device,
    engine: Engine,
    liveness: Arc<Liveness>,
    /// Global (job) rank of each member, indexed by rank in this communicator.
    members: Vec<usize>,
    config: NcclConfig,
    keep_alive: Vec<Box<dyn std::any::Any + Send + Sync>>,
}

impl NcclCommunicator {
    fn start(
        init: Init,
        device: &Device,
        (rank, members): (usize, Vec<usize>),
        liveness: Arc<Liveness>,
        config: NcclConfig,
    ) -> Result<Self> {
        let cuda = device
            .as_cuda_device()
            .map_err(|e| CommError::InvalidTensor {
                op: "init",
                reason: format!("the NCCL backend needs a CUDA device: {e}"),
            })?;
        let context = cuda.cuda_stream().context().clone();
        let world_size = members.len();
        let (watch_liveness, watch_members, timeout, watch_context) = (
            liveness.clone(),
            members.clone(),
            config.timeout,
            context.clone(),
        );
        let engine = Engine::start(
            init,
            context,
            (rank, world_size),
            config.timeout,
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
            device: device.clone(),
            engine,
            liveness,
            members,
            config,
            keep_alive: Vec::new(),
        })
    }

    /// The GPU this rank's operations run on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    fn keep_alive(&mut self, thing: Box<dyn std::any::Any + Send + Sync>) {
        self.keep_alive.push(thing);
    }

    /// Checks that `tensor` lives on this communicator's GPU and makes it contiguous.
    fn prepare(&self, op: &'static str, tensor: &Tensor) -> Result<Tensor> {
        if !tensor.device().same_device(&self.device) {
            return Err(CommError::InvalidTensor {
                op,
                reason: format!(
                    "the tensor is on {:?} but this rank's communicator is on {:?}",
                    tensor.device(),
                    self.device
                ),
            });
        }
        launch::element_type(op, tensor)?;
        tensor
            .flatten_all()
            .and_then(|t| t.contiguous())
            .map_err(|e| CommError::tensor(op, e))
    }

    /// A flat result tensor of `len` elements on this GPU, left uninitialised: NCCL writes
    /// every element before the result is delivered (a failed operation delivers an error,
    /// and a non-root's `reduce` delivers its input instead).
    fn alloc(&self, op: &'static str, len: usize, dtype: CandleDType) -> Result<Tensor> {
        let cuda = self
            .device
            .as_cuda_device()
            .map_err(|e| CommError::tensor(op, e))?;
        macro_rules! uninit {
            ($t:ty) => {
                // SAFETY: the memory is written by NCCL before anyone reads it (see above).
                unsafe { cuda.alloc::<$t>(len) }
                    .map(|slice| CudaStorage::wrap_cuda_slice(slice, cuda.clone()))
            };
        }
        let storage = match dtype {
            CandleDType::F32 => uninit!(f32),
            CandleDType::F64 => uninit!(f64),
            CandleDType::F16 => uninit!(half::f16),
            CandleDType::BF16 => uninit!(half::bf16),
            CandleDType::I64 => uninit!(i64),
            CandleDType::U8 => uninit!(u8),
            other => {
                return Err(CommError::InvalidTensor {
                    op,
                    reason: format!("dtype {other:?} is not supported"),
                })
            }
        }
        .map_err(|e| CommError::tensor(op, e))?;
        Ok(Tensor::from_storage(
            Storage::Cuda(storage),
            len,
            BackpropOp::none(),
            false,
        ))
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
        keep: Vec<Tensor>,
        result: Tensor,
        issue: Issue,
        deliver: Deliver,
    ) -> Result<()> {
        self.submit_polled(op, keep, result, issue, deliver, false)
    }

    /// [`Self::submit`], polled without back-off when `spin`.
    fn submit_polled(
        &self,
        op: &'static str,
        keep: Vec<Tensor>,
        result: Tensor,
        issue: Issue,
        deliver: Deliver,
        spin: bool,
    ) -> Result<()> {
        self.engine.health.check(op)?;
        let cuda = self
            .device
            .as_cuda_device()
            .map_err(|e| CommError::tensor(op, e))?;
        let ready = cuda
            .cuda_stream()
            .record_event(None)
            .map_err(|e| engine::driver(op, self.rank, e))?;
        self.engine.submit(Job {
            op,
            ready,
            keep,
            result,
            issue,
            deliver,
            spin,
        });
        Ok(())
    }
}

impl std::fmt::Debug for NcclCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NcclCommunicator(rank {} of {} on {:?})",
            self.rank, self.world_size, self.device
        )
    }
}
