//! Block models: a model is a sequence of blocks (ResNet: stem, each residual block, head).
//!
//! Cutting a model into blocks is what lets weft run backward one block at a time and act the
//! moment a block's gradients are final (DDP bucket all-reduce, ZeRO reduce-scatter, pipeline
//! send), recompute a block instead of storing its activations, or place blocks on different
//! ranks. Models stay free of parallelism: they only say what their blocks are.

use std::ops::Range;

use candle_core::Tensor;

use crate::cross_rank::CrossRankSlot;
use crate::error::Result;
use crate::params::{EntryId, EntryKind, ParamStore};

/// How a forward pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// Training mode (BatchNorm uses batch statistics) or evaluation mode (running statistics).
    pub train: bool,
    /// Whether BatchNorm may update its running statistics. False while a checkpointed block is
    /// recomputed during backward, so the statistics are updated exactly once per step.
    pub update_running_stats: bool,
}

impl Mode {
    pub const TRAIN: Mode = Mode {
        train: true,
        update_running_stats: true,
    };
    pub const EVAL: Mode = Mode {
        train: false,
        update_running_stats: false,
    };

    /// The same mode for recomputing a checkpointed block: no second statistics update.
    pub fn recompute(self) -> Mode {
        Mode {
            update_running_stats: false,
            ..self
        }
    }
}

/// One block of a model: a function of its input and of its own parameters and buffers.
pub trait Block: Send + Sync {
    /// The block's name, e.g. `layer1.0` or `stem`.
    fn name(&self) -> &str;

    /// Runs the block.
    fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor>;

    /// The store entries (parameters and buffers) this block owns, a contiguous id range.
    fn entries(&self) -> Range<EntryId>;
}

/// A model as its parameter store and its ordered blocks.
pub struct BlockModel {
    store: ParamStore,
    blocks: Vec<Box<dyn Block>>,
    batch_stats: CrossRankSlot,
}

impl BlockModel {
    pub fn new(store: ParamStore, blocks: Vec<Box<dyn Block>>) -> Self {
        Self {
            store,
            blocks,
            batch_stats: CrossRankSlot::default(),
        }
    }

    /// Declares the slot the model's batch-normalisation layers read (see [`CrossRankSlot`]).
    pub fn with_batch_stats_slot(mut self, slot: CrossRankSlot) -> Self {
        self.batch_stats = slot;
        self
    }

    /// The slot through which batch statistics are summed over ranks (SyncBatchNorm).
    pub fn batch_stats_slot(&self) -> &CrossRankSlot {
        &self.batch_stats
    }

    pub fn store(&self) -> &ParamStore {
        &self.store
    }

    pub fn blocks(&self) -> &[Box<dyn Block>] {
        &self.blocks
    }

    /// Ids of block `index`'s trainable parameters.
    pub fn block_parameter_ids(&self, index: usize) -> Vec<EntryId> {
        self.blocks[index]
            .entries()
            .filter(|&id| self.store.entries()[id].kind == EntryKind::Parameter)
            .collect()
    }

    /// Runs all blocks as one graph (inference, or a whole-graph `backward()` as a reference).
    pub fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        self.blocks
            .iter()
            .try_fold(x.clone(), |h, block| block.forward(&h, mode))
    }
}
