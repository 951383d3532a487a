//! Block-wise forward and backward with a grad-ready hook and optional activation checkpointing.
//!
//! Forward runs each block on its input cut off from the previous block (a fresh leaf variable),
//! so each block keeps a graph of its own. Backward walks the blocks from last to first: given
//! the gradient `g` of a block's output it back-propagates `g` through the block (the
//! vector-Jacobian product, [`crate::vjp`]), hands the block's parameter gradients to a
//! callback the moment they are final, and passes the gradient of the block's input on to the
//! previous block. A block with its own backward ([`crate::ExplicitBackward`]) runs graph-free
//! and keeps only what that backward needs. A checkpointed block keeps only its input and
//! recomputes its forward during backward, without updating BatchNorm statistics a second time.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use candle_core::{Tensor, Var};

use crate::block::{Block, BlockModel, ExplicitGrads, Mode, Saved};
use crate::error::{Result, TensorError};
use crate::params::EntryId;
use crate::timeline::Timeline;
use crate::vjp::backward_from;

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

/// The final gradients of one block's parameters, handed to the grad-ready callback.
#[derive(Debug)]
pub struct BlockGrads {
    /// Index of the block in the model.
    pub block: usize,
    /// `(entry id, gradient)` for each trainable parameter of the block; `None` where the
    /// parameter did not take part in this step's computation.
    pub grads: Vec<(EntryId, Option<Tensor>)>,
}

enum Record {
    /// Candle's graph of the block, from a leaf input (none for the first block).
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
    let mut records = Vec::with_capacity(model.blocks().len());
    let mut h = x.detach();
    for (i, block) in model.blocks().iter().enumerate() {
        let start = Instant::now();
        if checkpointing.applies_to(i) {
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
            let input = if i == 0 { None } else { Some(cut(&h)?) };
            let output = block.forward(input.as_ref().map_or(&h, |v| v.as_tensor()), mode)?;
            h = output.clone();
            records.push(Record::Kept { input, output });
        }
        if let Some(t) = &timeline {
            t.record(block.name(), "forward", "compute", start, Instant::now());
        }
    }
    Ok(Tape {
        records,
        mode,
        output: cut(&h)?,
        timeline,
    })
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

    /// Back-propagates `loss` (a scalar computed from [`Tape::output`]) through every block, last
    /// to first, calling `on_block_ready` as soon as each block's parameter gradients are final.
    /// The callback's error type only needs to hold a [`TensorError`].
    pub fn backward<F, E>(
        self,
        loss: &Tensor,
        model: &BlockModel,
        mut on_block_ready: F,
    ) -> std::result::Result<(), E>
    where
        F: FnMut(BlockGrads) -> std::result::Result<(), E>,
        E: From<TensorError>,
    {
        let Tape {
            mut records,
            mode,
            output,
            timeline,
        } = self;
        let mut grad = output_grad(loss, &output)?;
        for i in (0..records.len()).rev() {
            let record = records.pop().expect("one record per block");
            let (grads, input_grad) =
                backward_block(model, i, record, &grad, mode, timeline.as_deref())?;
            on_block_ready(grads)?;
            if let Some(g) = input_grad {
                grad = g;
            }
        }
        Ok(())
    }
}

/// The gradient of `loss` with respect to the model output.
fn output_grad(loss: &Tensor, output: &Var) -> Result<Tensor> {
    let grads = loss.backward()?;
    grads
        .get(output.as_tensor())
        .cloned()
        .ok_or_else(|| TensorError::Block {
            block: "loss".into(),
            message: "the loss does not depend on the model output".into(),
        })
}

/// Back-propagates `grad` (of block `i`'s output) through block `i`: returns the block's
/// parameter gradients and the gradient of its input (none for the first block).
fn backward_block(
    model: &BlockModel,
    i: usize,
    record: Record,
    grad: &Tensor,
    mode: Mode,
    timeline: Option<&Timeline>,
) -> Result<(BlockGrads, Option<Tensor>)> {
    let start = Instant::now();
    let block = &model.blocks()[i];
    let (input, output) = match record {
        Record::Kept { input, output } => (input, output),
        Record::Explicit { saved } => {
            return explicit_backward(model, i, saved, grad, start, timeline);
        }
        Record::Checkpointed { input: saved } => {
            if let Some((_, kept)) = forward_explicit(block.as_ref(), &saved, mode.recompute())? {
                return explicit_backward(model, i, kept, grad, start, timeline);
            }
            let input = if i == 0 { None } else { Some(cut(&saved)?) };
            let x = input.as_ref().map_or(saved, |v| v.as_tensor().clone());
            let output = block.forward(&x, mode.recompute())?;
            (input, output)
        }
    };
    let mut block_grads = backward_from(&output, &grad.to_dtype(output.dtype())?)?;
    let grads = model
        .block_parameter_ids(i)
        .into_iter()
        .map(|id| (id, block_grads.remove(model.store().entries()[id].tensor())))
        .collect();
    let input_grad = match input {
        Some(input) => {
            Some(
                block_grads
                    .remove(input.as_tensor())
                    .ok_or_else(|| TensorError::Block {
                        block: block.name().into(),
                        message: "the block output does not depend on its input".into(),
                    })?,
            )
        }
        None => None,
    };
    if let Some(t) = timeline {
        t.record(block.name(), "backward", "compute", start, Instant::now());
    }
    Ok((BlockGrads { block: i, grads }, input_grad))
}

/// [`backward_block`] for a block with its own backward.
fn explicit_backward(
    model: &BlockModel,
    i: usize,
    saved: Saved,
    grad: &Tensor,
    start: Instant,
    timeline: Option<&Timeline>,
) -> Result<(BlockGrads, Option<Tensor>)> {
    let block = &model.blocks()[i];
    let explicit = block.explicit().ok_or_else(|| TensorError::Block {
        block: block.name().into(),
        message: "saved a hand-differentiated forward but has no backward".into(),
    })?;
    let ExplicitGrads { input, params } = explicit.backward(saved, grad, i > 0)?;
    let grads = model
        .block_parameter_ids(i)
        .into_iter()
        .map(|id| {
            let param = model.store().entries()[id].tensor().id();
            let grad = params.iter().find(|(p, _)| *p == param);
            (id, grad.map(|(_, g)| g.clone()))
        })
        .collect();
    if i > 0 && input.is_none() {
        return Err(TensorError::Block {
            block: block.name().into(),
            message: "its backward returned no input gradient".into(),
        });
    }
    if let Some(t) = timeline {
        t.record(block.name(), "backward", "compute", start, Instant::now());
    }
    Ok((BlockGrads { block: i, grads }, input))
}

fn tensor_bytes(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}

/// Identifies a tensor's storage, so that views of one allocation are counted once.
fn storage_address(t: &Tensor) -> usize {
    let (storage, _) = t.storage_and_layout();
    std::ptr::from_ref(&*storage).addr()
}
