//! weft-parallel: the training step and the parallel strategies it runs under, over
//! weft-tensor block models, weft-collectives communicators and weft-optim optimizers. Models
//! stay free of parallelism; a strategy is called by the step at fixed points of forward,
//! backward and the update.
//!
//! - [`strategy`]: the [`Strategy`] trait, the seam every way of parallelising plugs into.
//! - [`step`]: [`Trainer`], one training step of any block model for any objective under any
//!   strategy, with micro-batches and CUDA-graph replay.
//! - [`collectives`]: [`TensorCollectives`], the communicators' operations on candle tensors,
//!   natively on the device where the backend can (NCCL), and [`init_for_device`].
//! - [`clip`]: gradient clipping by the global norm over ranks, on the device.
//! - [`single`]: [`SingleProcess`], the strategy of one rank.
//! - [`ddp`]: data parallelism — [`ddp::NaiveDataParallel`] (all-reduce every gradient after
//!   backward, the reference) beside [`ddp::DistributedDataParallel`] (gradients grouped into
//!   buckets in reverse order, each bucket all-reduced asynchronously the moment backward has
//!   produced all its gradients, overlapping communication with the rest of backward).
//! - [`sync_bn`]: SyncBatchNorm, batch statistics of the global batch over all ranks.
//! - [`mesh`]: the device mesh, named axes `dp`, `tp`, `pp` and their sub-communicators.
//! - [`pipeline`]: pipeline schedules as checked plans (GPipe, 1F1B, forward-only), the
//!   partition of a model's blocks into stages, and their execution over point-to-point links.
//! - [`tensor`]: Megatron tensor parallelism — column/row-parallel linear layers, the
//!   vocabulary-parallel embedding and cross-entropy, and the f/g collectives joining them.
//! - [`zero`]: ZeRO — the optimizer's states (stage 1), the gradients (2) and the parameters
//!   (3, FSDP) sharded over the data-parallel ranks, beside a naive reference; sharded
//!   checkpoints.

pub mod clip;
pub mod collectives;
pub mod ddp;
pub mod error;
pub mod mesh;
pub mod pipeline;
mod ready;
pub mod single;
pub mod step;
pub mod strategy;
pub mod sync_bn;
pub mod tensor;
pub mod zero;

pub use clip::clip_grad_norm;
pub use collectives::{init_for_device, TensorCollectives, TensorWork};
pub use ddp::{
    BufferBroadcast, DdpConfig, DistributedDataParallel, GradCompression, NaiveDataParallel,
};
pub use error::{ParallelError, Result};
pub use single::SingleProcess;
pub use step::{
    EvalOutcome, LaunchedStep, MemorySample, ModelStateBytes, StepOutcome, StepTimings, Trainer,
};
pub use strategy::{ReadyGrads, Strategy};
pub use sync_bn::{convert_sync_batch_norm, AllReduceSum};
