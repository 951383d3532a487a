//! RMSNorm over the last dimension (Llama's): `x · rstd · w` with
//! `rstd = 1 / sqrt(mean(x²) + eps)`, fused. The backward is
//! `dx = rstd (g − x̂ mean(g x̂))`, `g = dy · w`, `x̂ = x · rstd`, and `dw` the column sums of
//! `dy · x̂`.
//!
//! CUDA bf16/f16 tensors run the 16-bit kernels of `kernels/layer_norm.cu` (LayerNorm's, without
//! the mean and the bias): 16-bit values in and out, f32 inside, each result rounded once, the
//! forward through this op (so it stays differentiable) and a fused backward writing `dx` and
//! each block's column sums, added in a fixed order into `dw`. CPU f32/f64 tensors run a kernel
//! computing in f64, their backward Candle's ops on the formula above; other 16-bit tensors are
//! widened to f32 and their results rounded once; CUDA f32/f64 tensors take
//! [`rms_norm_reference`]. Hugging Face rounds `x̂` to the input's type before the weight
//! multiplies it; this op rounds once, at the end (the same in f32 within an ulp).

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

use super::project::column_sums;
use super::storage::{
    is_half, run_kernel, uses_cpu_kernels, uses_cuda_half_kernels, widen, Arg, CpuKernel, Float,
};

/// RMSNorm of `x` (`[.., C]`) with `weight` (`[C]`), differentiable.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let cols = x.dim(D::Minus1)?;
    if weight.dims() != [cols] {
        bail!("rms_norm: weight {:?} must be [{cols}]", weight.dims());
    }
    let tensors = [x, weight];
    let half_kernels = uses_cuda_half_kernels(&tensors);
    if is_half(&tensors) && !half_kernels {
        return rms_norm(&widen(x)?, &widen(weight)?, eps)?.to_dtype(x.dtype());
    }
    if !(half_kernels || uses_cpu_kernels(&tensors)) {
        return rms_norm_reference(x, weight, eps);
    }
    let rows = x.elem_count() / cols;
    let y = x
        .reshape((rows, cols))?
        .contiguous()?
        .apply_op2(&weight.contiguous()?, RmsNormOp { eps })?;
    y.reshape(x.shape())
}

/// The gradients `(dx, dw)` of [`rms_norm`] of `x` (`[.., C]`) with `weight` from the output's
/// gradient `dy`, without an autograd graph.
pub fn rms_norm_backward(
    x: &Tensor,
    weight: &Tensor,
    dy: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor)> {
    let cols = x.dim(D::Minus1)?;
    let rows = x.elem_count() / cols;
    let (x2, dy2) = (x.reshape((rows, cols))?, dy.reshape((rows, cols))?);
    let tensors = [x, weight, dy];
    #[cfg(feature = "cuda")]
    if uses_cuda_half_kernels(&tensors) && cols <= super::layer_norm_cuda::MAX_BACKWARD_COLS {
        let (dx, dw, _) = super::layer_norm_cuda::backward_half(
            super::layer_norm_cuda::Norm::Rms,
            &x2.contiguous()?,
            &weight.contiguous()?,
            &dy2.contiguous()?,
            eps,
        )?;
        return Ok((dx.reshape(x.shape())?, dw));
    }
    if is_half(&tensors) {
        let (dx, dw) = rms_norm_backward(&widen(x)?, &widen(weight)?, &widen(dy)?, eps)?;
        return Ok((dx.to_dtype(x.dtype())?, dw.to_dtype(x.dtype())?));
    }
    let rstd = (x2.sqr()?.mean_keepdim(D::Minus1)? + eps)?
        .sqrt()?
        .recip()?;
    let xhat = x2.broadcast_mul(&rstd)?;
    let g = dy2.broadcast_mul(weight)?;
    let mean_gx = (&g * &xhat)?.mean_keepdim(D::Minus1)?;
    let dx = (g - xhat.broadcast_mul(&mean_gx)?)?.broadcast_mul(&rstd)?;
    let dw = column_sums(&(dy2 * xhat)?.contiguous()?)?;
    Ok((dx.reshape(x.shape())?, dw))
}

/// The same through Candle's ops, as Hugging Face's Llama computes it: 16-bit inputs
/// normalised in f32 and rounded back before the weight multiplies them.
pub fn rms_norm_reference(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let dtype = x.dtype();
    let wide = match dtype {
        DType::F64 => x.clone(),
        _ => x.to_dtype(DType::F32)?,
    };
    let mean_square = wide.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = wide.broadcast_div(&(mean_square + eps)?.sqrt()?)?;
    normed.to_dtype(dtype)?.broadcast_mul(weight)
}

#[derive(Debug, Clone, Copy)]
struct RmsNormOp {
    eps: f64,
}

struct RmsNormKernel {
    cols: usize,
    eps: f64,
}

impl CpuKernel for RmsNormKernel {
    fn run<T: Float>(&self, args: &[&[T]]) -> Result<Vec<T>> {
        let cols = self.cols;
        let mut out = vec![T::ZERO; args[0].len()];
        out.par_chunks_mut(cols).enumerate().for_each(|(i, out)| {
            let row = &args[0][i * cols..(i + 1) * cols];
            let squares: f64 = row.iter().map(|v| v.to_f64().powi(2)).sum();
            let rstd = 1.0 / (squares / cols as f64 + self.eps).sqrt();
            for ((o, x), w) in out.iter_mut().zip(row).zip(args[1]) {
                *o = T::from_f64(x.to_f64() * rstd * w.to_f64());
            }
        });
        Ok(out)
    }
}

impl CustomOp2 for RmsNormOp {
    fn name(&self) -> &'static str {
        "rms_norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, cols) = l1.shape().dims2()?;
        let kernel = RmsNormKernel {
            cols,
            eps: self.eps,
        };
        let args = [Arg::new(s1, l1, "x"), Arg::new(s2, l2, "weight")];
        Ok((run_kernel(&kernel, self.name(), &args)?, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        use super::layer_norm_cuda::{forward_half, Norm};
        use candle_core::backend::BackendStorage;
        let (rows, cols) = l1.shape().dims2()?;
        let dims = (rows, cols, self.eps);
        let args = [(s1, l1), (s2, l2)];
        let y = match s1.dtype() {
            DType::BF16 => forward_half::<half::bf16>(Norm::Rms, dims, &args)?,
            DType::F16 => forward_half::<half::f16>(Norm::Rms, dims, &args)?,
            other => bail!("rms_norm: CUDA {other:?} takes rms_norm_reference, not this op"),
        };
        Ok((y, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw) = rms_norm_backward(x, weight, dy, self.eps)?;
        Ok((Some(dx), Some(dw)))
    }
}
