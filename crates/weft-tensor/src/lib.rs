//! weft-tensor: the tensor and autograd layer of weft, on Candle.
//!
//! - [`params`]: named parameters and buffers in PyTorch `state_dict` order;
//!   [`state_dict`] saves and loads them as safetensors.
//! - [`flat`]: parameters or gradients of one dtype in one contiguous buffer, the unit that
//!   optimizers step over and that data-parallel layers bucket and shard.
//! - [`block`] and [`tape`]: models as sequences of blocks, a block-wise backward that reports
//!   gradients the moment they are final (tied weights once, summed), hooks before each
//!   block's forward and backward, backward from a loss or a given output gradient, and
//!   per-block activation checkpointing.
//! - [`residency`]: a parameter's storage released and materialised again (ZeRO-3);
//!   [`sharded_init`]: a model built keeping only one rank's shard of its parameters.
//! - [`objective`]: what a training step minimises (a loss and its metrics), task-agnostic.
//! - [`vjp`]: back-propagation from a given output gradient.
//! - [`cross_rank`]: the hook through which SyncBatchNorm reaches the other ranks.
//! - `cuda_runtime` (feature `cuda`): the memory pool and stream settings of a GPU for
//!   training, and its memory high-water marks.
//! - [`timeline`]: per-rank step timelines written as Chrome traces.
//! - [`ops`]: fast CPU kernels (convolution, max-pool, batch-norm) with backward passes.

pub mod block;
pub mod cross_rank;
#[cfg(feature = "cuda")]
pub mod cuda_runtime;
pub mod durable;
pub mod error;
pub mod flat;
pub mod hf_checkpoint;
pub mod objective;
pub mod ops;
pub mod params;
pub mod private_files;
pub mod residency;
pub mod sharded_init;
pub mod state_dict;
pub mod tape;
pub mod timeline;
pub mod vjp;

pub use block::{Block, BlockModel, ExplicitBackward, ExplicitGrads, Mode, ParamGrad, Saved};
pub use cross_rank::{CrossRankSlot, CrossRankSum};
pub use error::{Result, TensorError};
pub use flat::{FlatBuffer, FlatLayout, Slot};
pub use objective::{LossOutput, Objective};
pub use params::{Entry, EntryId, EntryKind, ParamStore, Scope};
pub use tape::{BackwardHooks, BlockGrads, Checkpointing, Seed, Tape, TapeOptions};
pub use timeline::Timeline;
