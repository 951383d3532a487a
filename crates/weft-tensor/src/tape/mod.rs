//! Block-wise forward and backward with hooks at every block and optional activation
//! checkpointing.
//!
//! Forward runs each block on its input cut off from the previous block (a fresh leaf variable),
//! so each block keeps a graph of its own. Backward ([`Tape::backward_with`]) walks the blocks from last to
//! first: given the gradient `g` of a block's output it back-propagates `g` through the block
//! (the vector-Jacobian product, [`crate::vjp`]), reports the parameter gradients that are final
//! the moment they are, and passes the gradient of the block's input on to the previous block.
//! A block with its own backward ([`crate::ExplicitBackward`]) runs graph-free and keeps only
//! what that backward needs. A checkpointed block keeps only its input and recomputes its
//! forward during backward, without updating BatchNorm statistics a second time.
//!
//! The hooks are where parallel strategies act: before a block's forward and before its
//! backward (gathering sharded parameters), and when gradients are final (communicating them).
//! Backward can start from a scalar loss or from a given gradient of the model's output (a
//! pipeline stage receiving it from the next stage), and can return the gradient of the
//! model's input (to send to the previous stage).

mod backward;

use std::collections::HashSet;
use std::sync::Arc;

use candle_core::{Tensor, Var};

pub use backward::{BackwardHooks, Seed};

use crate::block::{Block, BlockModel, Mode, Saved};
use crate::error::{Result, TensorError};
use crate::params::EntryId;
use crate::timeline::Timeline;

/// Which blocks keep only their input and recompute their forward during backward.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Checkpointing {
    #[default]
    None,
    All,
    Blocks(Vec<usize>),
}

impl Checkpointing {
    fn applies_to(&self, block: usize) -> bool {
        match self {
            Checkpointing::None => false,
            Checkpointing::All => true,
            Checkpointing::Blocks(list) => list.contains(&block),
        }
    }
}

/// How a block-wise forward pass runs and what it keeps for backward.
#[derive(Clone, Default)]
pub struct TapeOptions {
    pub mode: Mode,
    pub checkpointing: Checkpointing,
    /// Records each block's forward and backward spans.
    pub timeline: Option<Arc<Timeline>>,
    /// Keep what the gradient of the model's input needs: backward then returns it.
    pub input_grad: bool,
}

/// The final gradients of parameters, reported after one block's backward.
#[derive(Debug)]
pub struct BlockGrads {
    /// Index of the block in the model.
    pub block: usize,
    /// `(entry id, gradient)` for each parameter whose gradient became final with this block
    /// (see [`BlockModel::gradients_final_after`]); `None` where the parameter took no part in
    /// this step's computation.
    pub grads: Vec<(EntryId, Option<Tensor>)>,
}

enum Record {
    /// Candle's graph of the block, from a leaf input (none where no input gradient is needed).
    Kept { input: Option<Var>, output: Tensor },
    /// Only the input: recomputed during backward.
    Checkpointed { input: Tensor },
    /// What a block with its own backward kept (see [`crate::ExplicitBackward`]).
    Explicit { saved: Saved },
}

/// What a block-wise forward pass keeps for its backward pass.
pub struct Tape {
    records: Vec<Record>,
    mode: Mode,
    input_grad: bool,
    output: Var,
    timeline: Option<Arc<Timeline>>,
}

/// A fresh leaf holding `t`'s value: the block boundary across which graphs are cut.
fn cut(t: &Tensor) -> Result<Var> {
    Ok(Var::from_tensor(&t.detach())?)
}

/// The block's own graph-free forward, when it has one for this input and mode.
fn forward_explicit(block: &dyn Block, x: &Tensor, mode: Mode) -> Result<Option<(Tensor, Saved)>> {
    match block.explicit() {
        Some(explicit) => explicit.forward_saving(&x.detach(), mode),
        None => Ok(None),
    }
}

/// Runs `model` block by block on `x`.
pub fn forward(
    model: &BlockModel,
    x: &Tensor,
    mode: Mode,
    checkpointing: &Checkpointing,
) -> Result<Tape> {
    forward_traced(model, x, mode, checkpointing, None)
}

/// [`forward`], recording each block's forward (and later its backward) on `timeline`.
pub fn forward_traced(
    model: &BlockModel,
    x: &Tensor,
    mode: Mode,
    checkpointing: &Checkpointing,
    timeline: Option<Arc<Timeline>>,
) -> Result<Tape> {
    let options = TapeOptions {
        mode,
        checkpointing: checkpointing.clone(),
        timeline,
        input_grad: false,
    };
    forward_with(model, x, &options, |_| Ok::<(), TensorError>(()))
}

/// Runs `model` block by block on `x` as `options` say, calling `before_block(i)` before
/// block `i`'s forward.
pub fn forward_with<E: From<TensorError>>(
    model: &BlockModel,
    x: &Tensor,
    options: &TapeOptions,
    mut before_block: impl FnMut(usize) -> std::result::Result<(), E>,
) -> std::result::Result<Tape, E> {
    let mode = options.mode;
    let mut records = Vec::with_capacity(model.blocks().len());
    let mut h = x.detach();
    for (i, block) in model.blocks().iter().enumerate() {
        before_block(i)?;
        let span = options
            .timeline
            .as_ref()
            .map(|t| t.open(block.name(), "forward", "compute"));
        if options.checkpointing.applies_to(i) {
            let output = match forward_explicit(block.as_ref(), &h, mode)? {
                // What the block would keep is dropped: backward recomputes it.
                Some((output, _)) => output,
                None => block.forward(&h, mode)?.detach(),
            };
            records.push(Record::Checkpointed { input: h });
            h = output;
        } else if let Some((output, saved)) = forward_explicit(block.as_ref(), &h, mode)? {
            records.push(Record::Explicit { saved });
            h = output;
        } else {
            let input = if i > 0 || options.input_grad {
                Some(cut(&h)?)
            } else {
                None
            };
            let output = block.forward(input.as_ref().map_or(&h, |v| v.as_tensor()), mode)?;
            h = output.clone();
            records.push(Record::Kept { input, output });
        }
        if let Some(span) = span {
            span.close();
        }
    }
    Ok(Tape {
        records,
        mode,
        input_grad: options.input_grad,
        output: cut(&h)?,
        timeline: options.timeline.clone(),
    })
}

/// Runs `model` on `x` without recording anything for backward: every block's graph-free
/// forward where it has one, and Candle's graph cut off after each block otherwise (Candle
/// has no no-grad mode). The evaluation path.
pub fn infer(model: &BlockModel, x: &Tensor, mode: Mode) -> Result<Tensor> {
    infer_with(model, x, mode, |_| Ok::<(), TensorError>(()))
}

/// [`infer`], calling `before_block(i)` before block `i` (ZeRO-3 gathers its parameters).
pub fn infer_with<E: From<TensorError>>(
    model: &BlockModel,
    x: &Tensor,
    mode: Mode,
    mut before_block: impl FnMut(usize) -> std::result::Result<(), E>,
) -> std::result::Result<Tensor, E> {
    let mut h = x.detach();
    for (i, block) in model.blocks().iter().enumerate() {
        before_block(i)?;
        h = match forward_explicit(block.as_ref(), &h, mode)? {
            Some((output, _)) => output,
            None => block.forward(&h, mode)?.detach(),
        };
    }
    Ok(h)
}

impl Tape {
    /// The model's output, a leaf of the loss graph: compute the loss from this tensor.
    pub fn output(&self) -> &Tensor {
        self.output.as_tensor()
    }

    /// Bytes held by the activations this tape keeps for backward (block inputs and the tensors
    /// recorded in each kept block's graph; views of other tensors are not counted twice).
    pub fn saved_activation_bytes(&self) -> usize {
        self.records
            .iter()
            .map(|r| match r {
                Record::Checkpointed { input } => tensor_bytes(input),
                Record::Explicit { saved } => {
                    let mut seen = HashSet::new();
                    saved
                        .iter()
                        .filter(|t| seen.insert(storage_address(t)))
                        .map(tensor_bytes)
                        .sum()
                }
                Record::Kept { input, output } => {
                    let mut seen = HashSet::new();
                    let graph: usize = output
                        .sorted_nodes()
                        .into_iter()
                        .filter(|n| !n.is_variable() && seen.insert(storage_address(n)))
                        .map(tensor_bytes)
                        .sum();
                    graph + input.as_ref().map_or(0, |v| tensor_bytes(v.as_tensor()))
                }
            })
            .sum()
    }
}

fn tensor_bytes(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}

/// Identifies a tensor's storage, so that views of one allocation are counted once.
fn storage_address(t: &Tensor) -> usize {
    let (storage, _) = t.storage_and_layout();
    std::ptr::from_ref(&*storage).addr()
}
