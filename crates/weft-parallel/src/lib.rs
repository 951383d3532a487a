//! weft-parallel: parallel training strategies over weft-tensor block models and
//! weft-collectives communicators. Models stay free of parallelism; a strategy wraps the
//! gradient path of a training step.
//!
//! - [`ddp`]: data parallelism — [`ddp::NaiveDataParallel`] (all-reduce every gradient after
//!   backward, the reference) beside [`ddp::DistributedDataParallel`] (gradients grouped into
//!   buckets in reverse order, each bucket all-reduced asynchronously the moment backward has
//!   produced all its gradients, overlapping communication with the rest of backward).
//! - [`sync_bn`]: SyncBatchNorm, batch statistics of the global batch over all ranks.

pub mod ddp;
pub mod error;
pub mod sync_bn;

pub use ddp::{DdpConfig, DistributedDataParallel, GradientSync, NaiveDataParallel};
pub use error::{ParallelError, Result};
pub use sync_bn::{convert_sync_batch_norm, AllReduceSum};
