//! Data parallelism: every rank holds the whole model, trains on its own slice of the global
//! batch, and averages gradients across ranks before the optimizer step, so all replicas
//! take identical steps.
//!
//! A trainer drives any strategy through [`GradientSync`]: `before_forward`, then
//! `block_ready` from the block-wise backward's grad-ready callback (after the block's
//! gradients were written into the flat gradient buffer), then `finish` before the optimizer.

mod bucketed;
mod buckets;
mod consistency;
mod naive;

use weft_tensor::{EntryId, FlatBuffer, ParamStore};

pub use bucketed::{BucketTiming, DistributedDataParallel};
pub use buckets::{Bucket, BucketPlan};
pub use consistency::{broadcast_entries, check_same_model};
pub use naive::NaiveDataParallel;

use crate::error::Result;

/// Settings of [`DistributedDataParallel`], named as in PyTorch.
#[derive(Debug, Clone, PartialEq)]
pub struct DdpConfig {
    /// Largest bucket, in MiB of gradients (PyTorch's default 25).
    pub bucket_cap_mb: f64,
    /// The first bucket (the last parameters, whose gradients come first) is capped at
    /// this many MiB so communication starts early (PyTorch uses 1 MiB).
    pub first_bucket_cap_mb: f64,
    /// Broadcast buffers (BatchNorm running statistics) from rank 0 before every forward.
    pub broadcast_buffers: bool,
}

impl Default for DdpConfig {
    fn default() -> Self {
        Self {
            bucket_cap_mb: 25.0,
            first_bucket_cap_mb: 1.0,
            broadcast_buffers: true,
        }
    }
}

/// How a training step synchronises gradients across ranks.
pub trait GradientSync {
    /// Called before each forward pass.
    fn before_forward(&mut self, store: &ParamStore) -> Result<()>;

    /// Called when backward has written the final gradients of `params` into `grads`.
    fn block_ready(&mut self, params: &[EntryId], grads: &FlatBuffer) -> Result<()>;

    /// Called after backward; on return `grads` holds the gradients averaged over ranks.
    fn finish(&mut self, grads: &FlatBuffer) -> Result<()>;

    /// Whether the next backward communicates (false inside `no_sync` gradient accumulation).
    fn set_require_sync(&mut self, sync: bool);

    /// Waits until the device has finished the step's communication (for strategies whose
    /// operations are ordered on the device only), failing on a dead peer or a timeout rather
    /// than blocking forever; called before the step's results are read.
    fn wait_for_device(&mut self) -> Result<()> {
        Ok(())
    }

    /// Whether a step synchronised by this strategy can be captured in a CUDA graph (its
    /// operations never wait on the host).
    fn capturable(&self) -> bool {
        false
    }
}
