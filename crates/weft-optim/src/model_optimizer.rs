//! [`ModelOptimizer`]: an optimizer over a model's flat buffers, on the parameters' device.
//! Either a slice optimizer ([`crate::Optimizer`], PyTorch's rule as one vectorised loop)
//! stepping a flat master copy of the parameters in place inside its storage, then writing
//! the values back into the model; or the tensor SGD updating the model's parameter tensors
//! in place on their own device (one fused kernel launch per 48 parameters on a GPU).
//!
//! A step covers a range of the flat buffers: the whole of them for one process or DDP, this
//! rank's shard under ZeRO (see weft-parallel's `Strategy::optimizer_range`).

use std::ops::Range;

use candle_core::{DType, Tensor};
use weft_tensor::flat::HostElement;
use weft_tensor::{FlatBuffer, ParamStore};

use crate::{OptimError, Optimizer, Real, TensorSgd};

const NAME: &str = "model optimizer";

fn tensor_error(e: impl std::fmt::Display) -> OptimError {
    OptimError::Tensor {
        optimizer: NAME,
        reason: e.to_string(),
    }
}

/// An optimizer over flat buffers of the model's dtype.
pub enum ModelOptimizer {
    /// A slice optimizer over an f32 flat master copy.
    F32(Box<dyn Optimizer<f32> + Send>),
    /// A slice optimizer over an f64 flat master copy.
    F64(Box<dyn Optimizer<f64> + Send>),
    /// SGD on the parameters' device, updating the model's parameter tensors in place (no
    /// master copy).
    Tensor(TensorSgd),
}

impl ModelOptimizer {
    /// The dtype the optimizer needs, `None` when it takes any (tensor operations).
    pub fn dtype(&self) -> Option<DType> {
        match self {
            ModelOptimizer::F32(_) => Some(DType::F32),
            ModelOptimizer::F64(_) => Some(DType::F64),
            ModelOptimizer::Tensor(_) => None,
        }
    }

    /// Whether the optimizer steps a flat master copy of the parameters.
    pub fn needs_master_copy(&self) -> bool {
        !matches!(self, ModelOptimizer::Tensor(_))
    }

    /// Sets the learning rate of the next step (for the tensor SGD on a GPU this writes the
    /// device copy of the rate, so call it outside a captured CUDA graph).
    pub fn set_lr(&mut self, lr: f64) -> Result<(), OptimError> {
        match self {
            ModelOptimizer::F32(opt) => opt.set_lr(lr),
            ModelOptimizer::F64(opt) => opt.set_lr(lr),
            ModelOptimizer::Tensor(opt) => opt.set_lr(lr),
        }
    }

    /// Number of steps taken.
    pub fn step_count(&self) -> u64 {
        match self {
            ModelOptimizer::F32(opt) => opt.step_count(),
            ModelOptimizer::F64(opt) => opt.step_count(),
            ModelOptimizer::Tensor(opt) => opt.step_count(),
        }
    }

    /// Steps the parameters of `store` in `range` of the flat buffers with `grads`: through
    /// the flat master copy `params` (then written back into the store), or in place. The
    /// optimizer's state covers `range`, which must stay the same from step to step; the
    /// tensor SGD needs it to fall on parameter boundaries.
    pub fn step(
        &mut self,
        params: Option<&FlatBuffer>,
        grads: &FlatBuffer,
        store: &ParamStore,
        range: Range<usize>,
    ) -> Result<(), OptimError> {
        let master = || {
            params.ok_or(OptimError::Tensor {
                optimizer: NAME,
                reason: "this optimizer steps a flat master copy, but none was given".into(),
            })
        };
        match self {
            ModelOptimizer::F32(opt) => step_master(opt.as_mut(), master()?, grads, store, range),
            ModelOptimizer::F64(opt) => step_master(opt.as_mut(), master()?, grads, store, range),
            ModelOptimizer::Tensor(opt) => {
                let mut tensors: Vec<&Tensor> = Vec::new();
                let mut offsets = Vec::new();
                for slot in grads.layout().slots() {
                    let slot_range = slot.range();
                    if slot_range.end <= range.start || slot_range.start >= range.end {
                        continue;
                    }
                    if slot_range.start < range.start || slot_range.end > range.end {
                        return Err(tensor_error(format!(
                            "the range {range:?} cuts parameter `{}` ({slot_range:?})",
                            slot.name
                        )));
                    }
                    tensors.push(store.entries()[slot.entry].tensor());
                    offsets.push(slot.offset - range.start);
                }
                let grads = grads
                    .tensor()
                    .narrow(0, range.start, range.len())
                    .map_err(tensor_error)?;
                opt.step_tensors(&tensors, &offsets, &grads)
            }
        }
    }
}

/// Steps `range` of the flat master copy `params` in place with a slice optimizer, then
/// writes the master copy into the model's variables.
fn step_master<T: Real + HostElement>(
    optimizer: &mut (dyn Optimizer<T> + Send),
    params: &FlatBuffer,
    grads: &FlatBuffer,
    store: &ParamStore,
    range: Range<usize>,
) -> Result<(), OptimError> {
    let mut result = Ok(());
    params
        .update_with(grads, range, |p: &mut [T], g: &[T]| {
            result = optimizer.step(p, g)
        })
        .map_err(tensor_error)?;
    result?;
    params.copy_to_store(store).map_err(tensor_error)
}
