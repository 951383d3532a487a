//! Undoing the loss scale: gradients multiplied by the inverse scale, and whether any of them
//! is inf or NaN, in one pass (`torch._amp_foreach_non_finite_check_and_unscale_`; one kernel
//! launch on a GPU, weft-tensor's [`weft_tensor::ops::unscale_and_check`]). The flag stays a
//! tensor on the gradients' device, so a step can reduce it across ranks and decide without
//! reading it on the host mid-step.

use std::ops::Range;

use candle_core::Tensor;

use crate::error::PrecisionError;

/// Multiplies `range` of the flat gradient buffer `grads` (f32, f64, bf16 or f16) in place by
/// `inverse_scale` and returns a one-element f32 tensor on the same device: 1 if any gradient
/// of the range (before unscaling) was inf or NaN, 0 otherwise. The product is computed in f32
/// (f64 for an f64 buffer) and rounded once to the buffer's dtype.
pub fn unscale_and_check(
    grads: &Tensor,
    range: Range<usize>,
    inverse_scale: f64,
) -> Result<Tensor, PrecisionError> {
    Ok(weft_tensor::ops::unscale_and_check(
        grads,
        range,
        inverse_scale,
    )?)
}
