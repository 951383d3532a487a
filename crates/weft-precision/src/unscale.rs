//! Undoing the loss scale: gradients multiplied by the inverse scale, and whether any of them
//! is inf or NaN, in one pass (`torch._amp_foreach_non_finite_check_and_unscale_`). The flag
//! stays a tensor on the gradients' device, so a step can reduce it across ranks and decide
//! without reading it on the host mid-step.

use std::ops::Range;

use candle_core::{DType, Tensor};

use crate::error::PrecisionError;

/// Multiplies `range` of the flat gradient buffer `grads` (any float dtype) in place by
/// `inverse_scale` and returns a one-element f32 tensor on the same device: 1 if any gradient
/// of the range (before unscaling) was inf or NaN, 0 otherwise. The product is computed in f32
/// and rounded once to the buffer's dtype.
pub fn unscale_and_check(
    grads: &Tensor,
    range: Range<usize>,
    inverse_scale: f64,
) -> Result<Tensor, PrecisionError> {
    let part = grads.narrow(0, range.start, range.len())?;
    let wide = part.to_dtype(DType::F32)?;
    // 0 · inf and 0 · NaN are NaN, 0 · finite is 0: a non-finite element makes the sum NaN.
    let probe = wide.affine(0.0, 0.0)?.sum_all()?;
    let found = probe
        .ne(&probe.zeros_like()?)?
        .to_dtype(DType::F32)?
        .reshape(1)?;
    let unscaled = wide.affine(inverse_scale, 0.0)?.to_dtype(grads.dtype())?;
    grads.slice_set(&unscaled, 0, range.start)?;
    Ok(found)
}
