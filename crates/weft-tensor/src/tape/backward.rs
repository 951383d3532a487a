//! The block-wise backward pass: from a scalar loss or a given output gradient, block by block
//! from last to first, reporting parameter gradients as soon as they are final. A parameter
//! several blocks use (tied weights) has its contributions summed and is reported once, with
//! the earliest block that uses it.

use std::collections::HashMap;

use candle_core::{Tensor, Var};

use super::{cut, forward_explicit, BlockGrads, Record, Tape};
use crate::block::{BlockModel, ExplicitGrads, Mode};
use crate::error::{Result, TensorError};
use crate::params::EntryId;
use crate::vjp::backward_from;

/// Where backward starts.
#[derive(Debug, Clone, Copy)]
pub enum Seed<'a> {
    /// A scalar computed from [`Tape::output`]: back-propagated to the output first.
    Loss(&'a Tensor),
    /// The gradient of the model's output itself (e.g. received from the next pipeline stage).
    OutputGrad(&'a Tensor),
}

/// What a strategy does during backward: before each block's backward, and when gradients
/// are final.
pub trait BackwardHooks<E> {
    /// Called before block `block`'s backward (ZeRO-3 gathers its parameters here).
    fn before_block(&mut self, _block: usize) -> std::result::Result<(), E> {
        Ok(())
    }

    /// Called with the gradients that became final after a block's backward.
    fn block_ready(&mut self, grads: BlockGrads) -> std::result::Result<(), E>;
}

/// [`BackwardHooks`] made of a grad-ready callback only.
struct OnReady<F>(F);

impl<F, E> BackwardHooks<E> for OnReady<F>
where
    F: FnMut(BlockGrads) -> std::result::Result<(), E>,
{
    fn block_ready(&mut self, grads: BlockGrads) -> std::result::Result<(), E> {
        (self.0)(grads)
    }
}

/// One block's gradients: of each parameter it uses, and of its input (if kept).
struct BlockBackward {
    params: Vec<(EntryId, Option<Tensor>)>,
    input: Option<Tensor>,
}

impl Tape {
    /// Back-propagates `loss` (a scalar computed from [`Tape::output`]) through every block, last
    /// to first, calling `on_block_ready` as soon as parameter gradients are final.
    /// The callback's error type only needs to hold a [`TensorError`].
    pub fn backward<F, E>(
        self,
        loss: &Tensor,
        model: &BlockModel,
        on_block_ready: F,
    ) -> std::result::Result<(), E>
    where
        F: FnMut(BlockGrads) -> std::result::Result<(), E>,
        E: From<TensorError>,
    {
        self.backward_with(Seed::Loss(loss), model, &mut OnReady(on_block_ready))?;
        Ok(())
    }

    /// Back-propagates from `seed` through every block, last to first, calling `hooks`.
    /// Returns the gradient of the model's input when the forward pass kept what it needs
    /// ([`super::TapeOptions::input_grad`]), `None` otherwise.
    pub fn backward_with<E: From<TensorError>>(
        self,
        seed: Seed<'_>,
        model: &BlockModel,
        hooks: &mut dyn BackwardHooks<E>,
    ) -> std::result::Result<Option<Tensor>, E> {
        let Tape {
            mut records,
            mode,
            input_grad,
            output,
            timeline,
        } = self;
        let mut grad = match seed {
            Seed::Loss(loss) => output_grad(loss, &output)?,
            Seed::OutputGrad(g) => check_output_grad(g, &output)?,
        };
        // The output (a language model's logits: its largest tensor) is not needed past here.
        drop(output);
        // Partial sums of tied parameters' gradients, until their earliest user has run.
        let mut partial: HashMap<EntryId, Tensor> = HashMap::new();
        for i in (0..records.len()).rev() {
            let record = records.pop().expect("one record per block");
            hooks.before_block(i)?;
            let span = timeline
                .as_ref()
                .map(|t| t.open(model.blocks()[i].name(), "backward", "compute"));
            let wants_input = i > 0 || input_grad;
            let result = backward_block(model, i, record, &grad, mode, wants_input)?;
            if let Some(span) = span {
                span.close();
            }
            for (id, g) in result.params {
                if let Some(g) = g {
                    let sum = match partial.remove(&id) {
                        Some(earlier) => (earlier + g).map_err(TensorError::from)?,
                        None => g,
                    };
                    partial.insert(id, sum);
                }
            }
            let grads = model
                .gradients_final_after(i)
                .iter()
                .map(|&id| (id, partial.remove(&id)))
                .collect();
            hooks.block_ready(BlockGrads { block: i, grads })?;
            if let Some(g) = result.input {
                grad = g;
            } else if wants_input {
                return Err(TensorError::Block {
                    block: model.blocks()[i].name().into(),
                    message: "its backward returned no input gradient".into(),
                }
                .into());
            }
        }
        Ok(input_grad.then_some(grad))
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

/// A given output gradient, checked against the output's shape.
fn check_output_grad(grad: &Tensor, output: &Var) -> Result<Tensor> {
    if grad.shape() != output.shape() {
        return Err(TensorError::Block {
            block: "output".into(),
            message: format!(
                "the output gradient has shape {:?}, the output {:?}",
                grad.dims(),
                output.dims()
            ),
        });
    }
    Ok(grad.to_dtype(output.dtype())?)
}

/// Back-propagates `grad` (of block `i`'s output) through block `i`: the gradients of the
/// parameters it uses and of its input (when `wants_input`).
fn backward_block(
    model: &BlockModel,
    i: usize,
    record: Record,
    grad: &Tensor,
    mode: Mode,
    wants_input: bool,
) -> Result<BlockBackward> {
    let block = &model.blocks()[i];
    let (input, output) = match record {
        Record::Kept { input, output } => (input, output),
        Record::Explicit { saved } => {
            return explicit_backward(model, i, saved, grad, wants_input);
        }
        Record::Checkpointed { input: saved } => {
            if let Some((_, kept)) = forward_explicit(block.as_ref(), &saved, mode.recompute())? {
                return explicit_backward(model, i, kept, grad, wants_input);
            }
            let input = if wants_input {
                Some(cut(&saved)?)
            } else {
                None
            };
            let x = input.as_ref().map_or(saved, |v| v.as_tensor().clone());
            let output = block.forward(&x, mode.recompute())?;
            (input, output)
        }
    };
    let mut block_grads = backward_from(&output, &grad.to_dtype(output.dtype())?)?;
    let params = model
        .parameters_used_by(i)
        .iter()
        .map(|&id| (id, block_grads.remove(model.store().entries()[id].tensor())))
        .collect();
    let input = match input {
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
    Ok(BlockBackward { params, input })
}

/// [`backward_block`] for a block with its own backward.
fn explicit_backward(
    model: &BlockModel,
    i: usize,
    saved: crate::block::Saved,
    grad: &Tensor,
    wants_input: bool,
) -> Result<BlockBackward> {
    let block = &model.blocks()[i];
    let explicit = block.explicit().ok_or_else(|| TensorError::Block {
        block: block.name().into(),
        message: "saved a hand-differentiated forward but has no backward".into(),
    })?;
    let ExplicitGrads { input, params } = explicit.backward(saved, grad, wants_input)?;
    let params = model
        .parameters_used_by(i)
        .iter()
        .map(|&id| {
            let param = model.store().entries()[id].tensor().id();
            let grad = params.iter().find(|(p, _)| *p == param);
            (id, grad.map(|(_, g)| g.clone()))
        })
        .collect();
    Ok(BlockBackward { params, input })
}
