//! [`FlatOptimizer`]: the optimizer of a [`crate::step::Trainer`], over the flat gradient
//! buffer: a slice optimizer of `weft-optim` stepping a flat master copy of the parameters on
//! the host, or the tensor SGD updating the model's parameters in place on their device.

use anyhow::{anyhow, Result};
use candle_core::{DType, Tensor};
use weft_optim::{Optimizer, TensorSgd};
use weft_tensor::{FlatBuffer, ParamStore};

/// An optimizer over flat buffers of the model's dtype: over host slices of a flat master copy
/// of the parameters (exact, for CPU buffers; GPU buffers make a round trip through the host),
/// or in place on the model's parameters on their own device.
pub enum FlatOptimizer {
    F32(Box<dyn Optimizer<f32> + Send>),
    F64(Box<dyn Optimizer<f64> + Send>),
    /// SGD on the parameters' device, for GPU training: the model's parameter tensors are
    /// updated in place (no master copy), one fused kernel launch per 48 parameters.
    Tensor(TensorSgd),
}

impl FlatOptimizer {
    /// The dtype the optimizer needs, `None` when it takes any (tensor operations).
    pub(crate) fn dtype(&self) -> Option<DType> {
        match self {
            FlatOptimizer::F32(_) => Some(DType::F32),
            FlatOptimizer::F64(_) => Some(DType::F64),
            FlatOptimizer::Tensor(_) => None,
        }
    }

    /// Whether the optimizer steps a flat master copy of the parameters.
    pub(crate) fn needs_master_copy(&self) -> bool {
        !matches!(self, FlatOptimizer::Tensor(_))
    }

    /// Sets the learning rate of the next step (for the tensor SGD on a GPU this writes the
    /// device copy of the rate, so it is called outside a captured step).
    pub(crate) fn set_lr(&mut self, lr: f64) -> Result<()> {
        match self {
            FlatOptimizer::F32(opt) => opt.set_lr(lr),
            FlatOptimizer::F64(opt) => opt.set_lr(lr),
            FlatOptimizer::Tensor(opt) => opt.set_lr(lr),
        }
        .map_err(|e| anyhow!("optimizer: {e}"))
    }

    /// Steps the parameters of `store` with `grads`: through the flat master copy `params`
    /// (then written back into the store), or in place.
    pub(crate) fn step(
        &mut self,
        params: Option<&FlatBuffer>,
        grads: &FlatBuffer,
        store: &ParamStore,
    ) -> Result<()> {
        let range = 0..grads.layout().len();
        let mut result = Ok(());
        let master = || params.ok_or_else(|| anyhow!("the optimizer needs a flat master copy"));
        match self {
            FlatOptimizer::F32(opt) => {
                master()?.update_with(grads, range, |p: &mut [f32], g: &[f32]| {
                    result = opt.step(p, g)
                })?;
                master()?.copy_to_store(store)?;
            }
            FlatOptimizer::F64(opt) => {
                master()?.update_with(grads, range, |p: &mut [f64], g: &[f64]| {
                    result = opt.step(p, g)
                })?;
                master()?.copy_to_store(store)?;
            }
            FlatOptimizer::Tensor(opt) => {
                let slots = grads.layout().slots();
                let tensors: Vec<&Tensor> = slots
                    .iter()
                    .map(|s| store.entries()[s.entry].tensor())
                    .collect();
                let offsets: Vec<usize> = slots.iter().map(|s| s.offset).collect();
                result = opt.step_tensors(&tensors, &offsets, grads.tensor());
            }
        }
        result.map_err(|e| anyhow!("optimizer step: {e}"))
    }
}
