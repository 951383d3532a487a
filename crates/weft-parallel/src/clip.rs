//! Gradient clipping by global norm (`torch.nn.utils.clip_grad_norm_`): the norm of every
//! gradient the optimizer is about to apply, over all ranks that hold a part of them, and the
//! gradients scaled by `max_norm / (norm + 1e-6)` where that is below 1. All on the gradients'
//! device, nothing read by the host, so a clipped step can be captured in a CUDA graph.

use std::ops::Range;

use candle_core::{DType, Tensor};
use weft_tensor::FlatBuffer;

use crate::error::Result;
use crate::strategy::Strategy;

/// Clips `grads[range]` (this rank's part, as [`Strategy::optimizer_range`] gives it) to the
/// global norm `max_norm`; returns the norm before clipping, a scalar on the device. The sum of
/// squares is computed in f32 (f64 for f64 gradients), weighed by
/// [`Strategy::local_grad_norm_squared`] and reduced over ranks by
/// [`Strategy::reduce_grad_norm_squared`].
pub fn clip_grad_norm(
    grads: &FlatBuffer,
    range: Range<usize>,
    max_norm: f64,
    strategy: &mut dyn Strategy,
) -> Result<Tensor> {
    let part = grads.range(&range)?;
    let wide = match part.dtype() {
        DType::F64 => DType::F64,
        _ => DType::F32,
    };
    let squares = part.to_dtype(wide)?.sqr()?;
    let local = strategy.local_grad_norm_squared(&squares, range.clone())?;
    let norm = strategy.reduce_grad_norm_squared(local)?.sqrt()?;
    let coefficient = (norm.affine(1.0, 1e-6)?.recip()? * max_norm)?.minimum(1.0)?;
    let clipped = part
        .to_dtype(wide)?
        .broadcast_mul(&coefficient)?
        .to_dtype(part.dtype())?;
    part.slice_set(&clipped, 0, 0)?;
    Ok(norm)
}
