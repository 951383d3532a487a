//! Block models: a model is a sequence of blocks (ResNet: stem, each residual block, head).
//!
//! Cutting a model into blocks is what lets weft run backward one block at a time and act the
//! moment a block's gradients are final (DDP bucket all-reduce, ZeRO reduce-scatter, pipeline
//! send), recompute a block instead of storing its activations, or place blocks on different
//! ranks. Models stay free of parallelism: they only say what their blocks are.

use std::ops::Range;

use candle_core::{Tensor, TensorId};

use crate::cross_rank::CrossRankSlot;
use crate::error::{Result, TensorError};
use crate::params::{EntryId, EntryKind, ParamStore};

/// How a forward pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// Training mode (BatchNorm uses batch statistics) or evaluation mode (running statistics).
    pub train: bool,
    /// Whether BatchNorm may update its running statistics. False while a checkpointed block is
    /// recomputed during backward, so the statistics are updated exactly once per step.
    pub update_running_stats: bool,
    /// The seed this forward's dropout masks derive from (with each block's and site's own
    /// parts, see [`crate::ops::dropout`]): set per micro-batch by the trainer, kept when a
    /// checkpointed block is recomputed, so that it drops what it dropped before.
    pub dropout_seed: u64,
    /// The step's dropout value, mixed into every mask's seed: set per step by the trainer,
    /// which also writes it on the device ([`crate::ops::set_dropout_step`]), where the
    /// device's masks read it.
    pub dropout_step: u64,
    /// Whether the forward must be differentiable. False only for inference
    /// ([`Mode::INFER`]), where layers may run graph-free kernels that keep no temporaries.
    pub differentiable: bool,
}

impl Default for Mode {
    fn default() -> Self {
        Mode::TRAIN
    }
}

impl Mode {
    pub const TRAIN: Mode = Mode {
        train: true,
        update_running_stats: true,
        dropout_seed: 0,
        dropout_step: 0,
        differentiable: true,
    };
    /// Evaluation mode (running statistics), still differentiable: a model may be trained
    /// with its batch norms frozen.
    pub const EVAL: Mode = Mode {
        train: false,
        update_running_stats: false,
        dropout_seed: 0,
        dropout_step: 0,
        differentiable: true,
    };
    /// Evaluation mode for inference: nothing will be differentiated.
    pub const INFER: Mode = Mode {
        differentiable: false,
        ..Mode::EVAL
    };

    /// The same mode with dropout masks derived from `seed`.
    pub fn with_dropout_seed(self, seed: u64) -> Mode {
        Mode {
            dropout_seed: seed,
            ..self
        }
    }

    /// The same mode with the step's dropout value `step` (see [`Mode::dropout_step`]).
    pub fn with_dropout_step(self, step: u64) -> Mode {
        Mode {
            dropout_step: step,
            ..self
        }
    }

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

    /// Parameters owned by another block that this block uses too (tied weights, e.g. a
    /// language model's head reusing the token embedding). Their gradient contributions are
    /// summed by the tape and reported once, at the earliest block that uses them.
    fn shared_parameters(&self) -> Vec<EntryId> {
        Vec::new()
    }

    /// The block's own backward pass, if it has one (see [`ExplicitBackward`]); the block-wise
    /// tape uses it instead of Candle's autograd.
    fn explicit(&self) -> Option<&dyn ExplicitBackward> {
        None
    }
}

/// The tensors a block with its own backward keeps from its forward pass, in an order of the
/// block's choosing.
pub type Saved = Vec<Tensor>;

/// A parameter's gradient, by the parameter tensor's id.
pub type ParamGrad = (TensorId, Tensor);

/// What a block's own backward pass returns.
#[derive(Debug)]
pub struct ExplicitGrads {
    /// The gradient of the block's input, when it was asked for.
    pub input: Option<Tensor>,
    /// The gradient of each of the block's parameters, by the parameter tensor's id.
    pub params: Vec<ParamGrad>,
}

/// A block that differentiates itself: a forward pass that records no autograd graph and
/// keeps only what its backward needs, and that backward, written out. Faster than Candle's
/// autograd (no graph bookkeeping, and no zero-filled accumulator for every gradient) and
/// lighter on memory; gradients must equal the autograd ones (the tape's tests compare them).
pub trait ExplicitBackward {
    /// Runs the block and returns its output with what [`ExplicitBackward::backward`] needs;
    /// `None` when it cannot differentiate itself for these tensors or this mode (the tape then
    /// records Candle's graph instead).
    fn forward_saving(&self, x: &Tensor, mode: Mode) -> Result<Option<(Tensor, Saved)>>;

    /// The gradients of the block's input (if `input_grad`) and parameters, from what
    /// `forward_saving` kept and the gradient `dy` of its output.
    fn backward(&self, saved: Saved, dy: &Tensor, input_grad: bool) -> Result<ExplicitGrads>;
}

/// A model as its parameter store and its ordered blocks.
pub struct BlockModel {
    store: ParamStore,
    blocks: Vec<Box<dyn Block>>,
    batch_stats: CrossRankSlot,
    /// Per block: the parameters it uses (its own, then the shared ones).
    uses: Vec<Vec<EntryId>>,
    /// Per block: the parameters whose gradients are final after its backward (those whose
    /// earliest user it is), in store order.
    reports: Vec<Vec<EntryId>>,
}

impl BlockModel {
    /// The model of `blocks` over `store`; fails, naming the block, when a block shares an
    /// entry that is not a parameter of the store or one it owns itself.
    pub fn new(store: ParamStore, blocks: Vec<Box<dyn Block>>) -> Result<Self> {
        let is_parameter =
            |id: EntryId| id < store.len() && store.entries()[id].kind == EntryKind::Parameter;
        let mut uses = Vec::with_capacity(blocks.len());
        for block in &blocks {
            let owned: Vec<EntryId> = block.entries().filter(|&id| is_parameter(id)).collect();
            let mut used = owned.clone();
            for id in block.shared_parameters() {
                if !is_parameter(id) || block.entries().contains(&id) || used.contains(&id) {
                    return Err(TensorError::Block {
                        block: block.name().into(),
                        message: format!(
                            "shares entry {id}, which is not another block's parameter"
                        ),
                    });
                }
                used.push(id);
            }
            uses.push(used);
        }
        let mut first_user = vec![usize::MAX; store.len()];
        for (i, used) in uses.iter().enumerate() {
            for &id in used {
                first_user[id] = first_user[id].min(i);
            }
        }
        let mut reports = vec![Vec::new(); blocks.len()];
        for (id, &block) in first_user.iter().enumerate() {
            if block != usize::MAX {
                reports[block].push(id);
            }
        }
        Ok(Self {
            store,
            blocks,
            batch_stats: CrossRankSlot::default(),
            uses,
            reports,
        })
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

    /// Ids of the trainable parameters block `index` uses: its own, then shared ones.
    pub fn parameters_used_by(&self, index: usize) -> &[EntryId] {
        &self.uses[index]
    }

    /// Ids of the parameters whose gradients are final once block `index`'s backward has run
    /// (the block-wise backward reports them with that block), in store order.
    pub fn gradients_final_after(&self, index: usize) -> &[EntryId] {
        &self.reports[index]
    }

    /// Runs all blocks as one graph (inference, or a whole-graph `backward()` as a reference).
    pub fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        self.blocks
            .iter()
            .try_fold(x.clone(), |h, block| block.forward(&h, mode))
    }
}
