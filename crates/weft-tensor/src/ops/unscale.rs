//! [`unscale_and_check`]: undoing the loss scale of a range of a flat gradient buffer in place
//! and finding inf/NaN in the same pass (`torch._amp_foreach_non_finite_check_and_unscale_`).
//! The flag is a tensor on the gradients' device, so a step can reduce it across ranks and
//! decide without reading it mid-step. CPU: one loop; CUDA: one launch (`kernels/unscale.cu`).
//! [`unscale_and_check_by`] reads the scale from a loss scaler's state tensor instead of the
//! host, for steps that run without it (a CUDA graph).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::backend::BackendStorage;
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, DType, InplaceOp1, Layout, Result, Tensor};

/// Multiplies `range` of the one-dimensional contiguous buffer `grads` (f32, f64, bf16 or f16)
/// in place by `inverse_scale` and returns a one-element f32 tensor on its device: 1 if any
/// element of the range was inf or NaN before unscaling, 0 otherwise. The product is computed
/// in f32 (f64 for an f64 buffer) and rounded once to the buffer's dtype.
pub fn unscale_and_check(
    grads: &Tensor,
    range: Range<usize>,
    inverse_scale: f64,
) -> Result<Tensor> {
    unscale(grads, range, Factor::Inverse(inverse_scale))
}

/// [`unscale_and_check`] by the inverse of `state[0]` (computed in f64): `state` is a loss
/// scaler's f64 state on the gradients' device, its first element the scale (see
/// [`super::update_loss_scale`]).
pub fn unscale_and_check_by(grads: &Tensor, range: Range<usize>, state: &Tensor) -> Result<Tensor> {
    if state.dtype() != DType::F64 || state.rank() != 1 || state.elem_count() == 0 {
        bail!(
            "unscale_and_check_by: the scaler's state must be an f64 vector, got {:?} {:?}",
            state.dims(),
            state.dtype()
        );
    }
    if !state.device().same_device(grads.device()) {
        bail!("unscale_and_check_by: the scaler's state is not on the gradients' device");
    }
    let factor = match grads.device().is_cpu() {
        true => Factor::Inverse(1.0 / state.get(0)?.to_scalar::<f64>()?),
        false => Factor::InverseOf(state.clone()),
    };
    unscale(grads, range, factor)
}

/// The factor the gradients are multiplied by.
pub(super) enum Factor {
    /// This inverse scale.
    Inverse(f64),
    /// The inverse of the first element of this f64 tensor on the gradients' device.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    InverseOf(Tensor),
}

fn unscale(grads: &Tensor, range: Range<usize>, factor: Factor) -> Result<Tensor> {
    if grads.rank() != 1 || !grads.is_contiguous() {
        bail!(
            "unscale_and_check: the gradients must be a contiguous vector, got {:?}",
            grads.dims()
        );
    }
    if range.start > range.end || range.end > grads.elem_count() {
        bail!(
            "unscale_and_check: range {range:?} outside the {} gradients",
            grads.elem_count()
        );
    }
    let part = grads.narrow(0, range.start, range.len())?;
    let found = Tensor::zeros(1, DType::F32, grads.device())?;
    let op = Unscale {
        factor,
        found_on_cpu: AtomicBool::new(false),
        found: found.clone(),
    };
    part.inplace_op1(&op)?;
    match grads.device().is_cpu() {
        true => {
            let flag = f32::from(u8::from(op.found_on_cpu.load(Ordering::Relaxed)));
            Tensor::new(&[flag], grads.device())
        }
        false => Ok(found),
    }
}

/// The in-place op; the CPU pass raises `found_on_cpu`, the CUDA pass writes `found`.
struct Unscale {
    factor: Factor,
    found_on_cpu: AtomicBool,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    found: Tensor,
}

impl InplaceOp1 for Unscale {
    fn name(&self) -> &'static str {
        "weft-unscale-and-check"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            bail!("unscale_and_check: the gradients must be contiguous");
        };
        let Factor::Inverse(inverse_scale) = self.factor else {
            bail!("unscale_and_check: a scale on a device for gradients on the CPU");
        };
        // f32 products for the f32 and 16-bit types (the factor rounded to f32 first).
        let factor32 = inverse_scale as f32;
        let bad = match storage {
            CpuStorage::F32(g) => g[start..end].iter_mut().fold(false, |bad, v| {
                let x = *v;
                *v = x * factor32;
                bad | !x.is_finite()
            }),
            CpuStorage::F64(g) => g[start..end].iter_mut().fold(false, |bad, v| {
                let x = *v;
                *v = x * inverse_scale;
                bad | !x.is_finite()
            }),
            CpuStorage::BF16(g) => g[start..end].iter_mut().fold(false, |bad, v| {
                let x = v.to_f32();
                *v = half::bf16::from_f32(x * factor32);
                bad | !x.is_finite()
            }),
            CpuStorage::F16(g) => g[start..end].iter_mut().fold(false, |bad, v| {
                let x = v.to_f32();
                *v = half::f16::from_f32(x * factor32);
                bad | !x.is_finite()
            }),
            other => bail!(
                "unscale_and_check: gradients of dtype {:?} are not supported",
                other.dtype()
            ),
        };
        self.found_on_cpu.fetch_or(bad, Ordering::Relaxed);
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &mut CudaStorage, layout: &Layout) -> Result<()> {
        super::unscale_cuda::run(storage, layout, &self.factor, &self.found)
    }
}
