//! Data parallelism: every rank holds the whole model, trains on its own slice of the global
//! batch, and averages gradients across ranks before the optimizer step, so all replicas
//! take identical steps.
//!
//! Both are [`crate::Strategy`] implementations: `before_forward`, then `block_ready` from
//! the block-wise backward (after the block's gradients were written into the flat gradient
//! buffer), then `finish_backward` before the optimizer.

mod bucketed;
mod buckets;
mod consistency;
mod in_flight;
mod naive;
mod replicas;

use candle_core::DType;

pub use bucketed::DistributedDataParallel;
pub(crate) use buckets::BucketCountdown;
pub use buckets::{Bucket, BucketCaps, BucketPlan};
pub use consistency::{broadcast_buffers, broadcast_entries, check_same_model};
pub use in_flight::BucketTiming;
pub use naive::NaiveDataParallel;
pub(crate) use replicas::{fence, fence_later, prepare_replicas};

/// Settings of [`DistributedDataParallel`], named as in PyTorch.
#[derive(Debug, Clone, PartialEq)]
pub struct DdpConfig {
    /// Largest bucket, in MiB of gradients (PyTorch's default 25).
    pub bucket_cap_mb: f64,
    /// The first bucket (the last parameters, whose gradients come first) is capped at
    /// this many MiB so communication starts early (PyTorch uses 1 MiB).
    pub first_bucket_cap_mb: f64,
    /// The last bucket (the first parameters, whose gradients come last) is capped at this
    /// many MiB, so that little communication is left once backward ends; 0 (the default, until
    /// measured on GPUs) leaves the last bucket to whatever the reverse walk ends with, as
    /// PyTorch does.
    pub last_bucket_cap_mb: f64,
    /// The optimizer steps the parameters of every other bucket while the last bucket's
    /// all-reduce runs, then that bucket's (where the step allows it: no loss scaler, no
    /// gradient clipping, which read every gradient first). The values are the same either way.
    pub step_during_last_bucket: bool,
    /// When every rank's buffers (BatchNorm running statistics) are made rank 0's.
    pub broadcast_buffers: BufferBroadcast,
    /// A parameter that receives no gradient in a step is reduced as zero instead of ending
    /// the run (a rank where it took no part contributes zero to the average).
    pub find_unused_parameters: bool,
    /// Reduce each bucket as a 16-bit copy and write the result back (PyTorch's
    /// `bf16_compress_hook` / `fp16_compress_hook`): half the bytes on the wire, the average
    /// rounded to 16 bits.
    pub grad_compression: GradCompression,
}

/// When DDP makes every rank's buffers (BatchNorm running statistics) rank 0's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BufferBroadcast {
    /// Never: each rank keeps the statistics of its own samples (PyTorch's
    /// `broadcast_buffers=False`).
    Off,
    /// Before every forward, and before the buffers are read outside a training step
    /// (PyTorch's `broadcast_buffers=True`, whose first evaluation forward broadcasts too).
    #[default]
    EveryForward,
    /// Only before the buffers are read: evaluation, a forward in a mode that reads them
    /// (BatchNorm in evaluation mode), the whole model gathered for saving or reading
    /// ([`crate::Trainer::sync_buffers`]). For a model whose training forward writes its
    /// buffers without reading them into its output (BatchNorm in training mode normalises
    /// with the batch's statistics), every read sees what `EveryForward` gives: rank 0's
    /// statistics follow its own batches either way (a broadcast from rank 0 leaves its own
    /// unchanged), and the other ranks' are overwritten before they are read. One collective
    /// fewer in every step.
    BeforeReads,
}

/// How gradient buckets travel between ranks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GradCompression {
    /// In the gradients' own dtype.
    #[default]
    None,
    Bf16,
    Fp16,
}

impl GradCompression {
    /// The dtype buckets are reduced in, `None` for the gradients' own.
    pub fn dtype(self) -> Option<DType> {
        match self {
            GradCompression::None => None,
            GradCompression::Bf16 => Some(DType::BF16),
            GradCompression::Fp16 => Some(DType::F16),
        }
    }
}

impl DdpConfig {
    /// The caps in bytes the bucket plan uses (each capped at `bucket_cap_mb`).
    pub fn bucket_caps(&self) -> BucketCaps {
        let mib = |mb: f64| (mb * 1024.0 * 1024.0) as usize;
        BucketCaps {
            first: mib(self.first_bucket_cap_mb.min(self.bucket_cap_mb)),
            rest: mib(self.bucket_cap_mb),
            last: (self.last_bucket_cap_mb > 0.0)
                .then(|| mib(self.last_bucket_cap_mb.min(self.bucket_cap_mb))),
        }
    }
}

impl Default for DdpConfig {
    fn default() -> Self {
        Self {
            bucket_cap_mb: 25.0,
            first_bucket_cap_mb: 1.0,
            last_bucket_cap_mb: 0.0,
            step_during_last_bucket: true,
            broadcast_buffers: BufferBroadcast::EveryForward,
            find_unused_parameters: false,
            grad_compression: GradCompression::None,
        }
    }
}
