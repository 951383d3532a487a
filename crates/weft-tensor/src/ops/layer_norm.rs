//! LayerNorm over the last dimension, fused: `(x − mean) · rstd · w + b` with
//! `rstd = 1 / sqrt(var + eps)` (biased variance, PyTorch's semantics). Forward is one pass per
//! row; backward recomputes the rows' mean and rstd (one more read of `x`), computes `x̂`, the
//! weight and bias
//! gradients (column sums) with Candle's ops and the input gradient
//! `rstd (g − mean(g) − x̂ mean(g x̂))`, `g = dy · w`, in one pass per row. Composed from
//! Candle's ops, a LayerNorm's backward is some twenty passes over the activations, each with
//! autograd's zero-filled accumulator.
//!
//! CPU (f32/f64, computed in f64) and CUDA f32/f64 tensors run the kernels
//! (`kernels/layer_norm.cu` on a GPU). CUDA bf16/f16 tensors run its 16-bit kernels, which
//! read and write 16-bit values and compute in f32: the forward through the same op (so it
//! stays differentiable), and a fused backward writing `dx` and each block's f32 column sums of
//! `dy · x̂` and `dy`, which a second kernel adds in a fixed order into `dw` and `db`
//! (deterministic). Other 16-bit tensors (on the CPU) are widened to f32 and their results
//! rounded back once; other dtypes take [`layer_norm_reference`].

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

use super::project::column_sums;
use super::storage::{
    is_half, run_kernel, uses_cpu_kernels, uses_cuda_half_kernels, uses_cuda_kernels, widen, Arg,
    CpuKernel, Float,
};

/// LayerNorm of `x` (`[.., C]`) with `weight` and `bias` (`[C]`), differentiable.
pub fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
    let cols = x.dim(D::Minus1)?;
    if weight.dims() != [cols] || bias.dims() != [cols] {
        bail!(
            "layer_norm: weight {:?} and bias {:?} must be [{cols}]",
            weight.dims(),
            bias.dims()
        );
    }
    let tensors = [x, weight, bias];
    let half_kernels = uses_cuda_half_kernels(&tensors);
    if is_half(&tensors) && !half_kernels {
        // Statistics and normalisation in f32, the output rounded once.
        return layer_norm(&widen(x)?, &widen(weight)?, &widen(bias)?, eps)?.to_dtype(x.dtype());
    }
    if !(half_kernels || uses_cpu_kernels(&tensors) || uses_cuda_kernels(&tensors)) {
        return layer_norm_reference(x, weight, bias, eps);
    }
    let rows = x.elem_count() / cols;
    let op = LayerNormOp {
        pass: Pass::Forward,
        eps,
    };
    let flat = match x.rank() {
        2 => x.clone(),
        _ => x.reshape((rows, cols))?,
    };
    let y = flat
        .contiguous()?
        .apply_op3(&weight.contiguous()?, &bias.contiguous()?, op)?;
    match x.rank() {
        2 => Ok(y),
        _ => y.reshape(x.shape()),
    }
}

/// The gradients `(dx, dw, db)` of [`layer_norm`] of `x` (`[rows, C]`, contiguous) with
/// `weight` and `bias` from the output's gradient `dy`, computed by the fused kernels without an
/// autograd graph (for blocks that differentiate themselves; same conditions as the forward's
/// kernels, and CUDA bf16/f16 rows of at most 6144 columns for the fused 16-bit kernels).
pub fn layer_norm_backward(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    dy: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let tensors = [x, weight, bias, dy];
    #[cfg(feature = "cuda")]
    if uses_cuda_half_kernels(&tensors)
        && x.dim(D::Minus1)? <= super::layer_norm_cuda::MAX_BACKWARD_COLS
    {
        return super::layer_norm_cuda::backward_half(
            super::layer_norm_cuda::Norm::Layer,
            &x.contiguous()?,
            &weight.contiguous()?,
            &dy.contiguous()?,
            eps,
        );
    }
    if is_half(&tensors) {
        let (dx, dw, db) =
            layer_norm_backward(&widen(x)?, &widen(weight)?, &widen(bias)?, &widen(dy)?, eps)?;
        let narrow = |t: Tensor| t.to_dtype(x.dtype());
        return Ok((narrow(dx)?, narrow(dw)?, narrow(db)?));
    }
    backward_rows(
        &x.contiguous()?,
        &weight.contiguous()?,
        &bias.contiguous()?,
        &dy.contiguous()?,
        eps,
    )
}

/// The backward of the fused op over contiguous rows.
fn backward_rows(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    dy: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let moments = LayerNormOp {
        pass: Pass::Stats,
        eps,
    };
    let stats = x.apply_op3_no_bwd(weight, bias, &moments)?;
    let (mean, rstd) = (stats.narrow(1, 0, 1)?, stats.narrow(1, 1, 1)?);
    let xhat = x.broadcast_sub(&mean)?.broadcast_mul(&rstd)?;
    let dw = column_sums(&(dy * &xhat)?)?;
    let db = column_sums(dy)?;
    let g = dy.broadcast_mul(weight)?;
    let op = LayerNormOp {
        pass: Pass::BackwardInput,
        eps,
    };
    let dx = xhat
        .contiguous()?
        .apply_op3_no_bwd(&g.contiguous()?, &stats, &op)?;
    Ok((dx, dw, db))
}

/// The same through Candle's ops.
pub fn layer_norm_reference(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    let centred = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
    let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = centred.broadcast_div(&(var + eps)?.sqrt()?)?;
    normed.broadcast_mul(weight)?.broadcast_add(bias)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// `(x, w, b)` → `y`.
    Forward,
    /// `(x, w, b)` → `[mean | rstd]` per row.
    Stats,
    /// `(x̂, g, [mean | rstd])` → `dx`.
    BackwardInput,
}

#[derive(Debug, Clone, Copy)]
struct LayerNormOp {
    pass: Pass,
    eps: f64,
}

struct LayerNormKernel {
    pass: Pass,
    cols: usize,
    eps: f64,
}

impl CpuKernel for LayerNormKernel {
    fn run<T: Float>(&self, args: &[&[T]]) -> Result<Vec<T>> {
        let cols = self.cols;
        let rows = args[0].len() / cols;
        let width = match self.pass {
            Pass::Stats => 2,
            _ => cols,
        };
        let mut out = vec![T::ZERO; rows * width];
        out.par_chunks_mut(width).enumerate().for_each(|(i, out)| {
            let a: Vec<f64> = args[0][i * cols..(i + 1) * cols]
                .iter()
                .map(|v| v.to_f64())
                .collect();
            match self.pass {
                Pass::Forward | Pass::Stats => {
                    let mean = a.iter().sum::<f64>() / cols as f64;
                    let var = a.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / cols as f64;
                    let rstd = 1.0 / (var + self.eps).sqrt();
                    if self.pass == Pass::Stats {
                        out[0] = T::from_f64(mean);
                        out[1] = T::from_f64(rstd);
                        return;
                    }
                    for j in 0..cols {
                        let (w, b) = (args[1][j].to_f64(), args[2][j].to_f64());
                        out[j] = T::from_f64((a[j] - mean) * rstd * w + b);
                    }
                }
                Pass::BackwardInput => {
                    let g: Vec<f64> = args[1][i * cols..(i + 1) * cols]
                        .iter()
                        .map(|v| v.to_f64())
                        .collect();
                    let rstd = args[2][2 * i + 1].to_f64();
                    let mean_g = g.iter().sum::<f64>() / cols as f64;
                    let mean_gx = g.iter().zip(&a).map(|(g, x)| g * x).sum::<f64>() / cols as f64;
                    for j in 0..cols {
                        out[j] = T::from_f64(rstd * (g[j] - mean_g - a[j] * mean_gx));
                    }
                }
            }
        });
        Ok(out)
    }
}

impl CustomOp3 for LayerNormOp {
    fn name(&self) -> &'static str {
        match self.pass {
            Pass::Forward => "layer_norm_forward",
            Pass::Stats => "layer_norm_stats",
            Pass::BackwardInput => "layer_norm_backward_input",
        }
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (rows, cols) = l1.shape().dims2()?;
        let kernel = LayerNormKernel {
            pass: self.pass,
            cols,
            eps: self.eps,
        };
        let arg = Arg::new;
        let args = [arg(s1, l1, "a"), arg(s2, l2, "b"), arg(s3, l3, "c")];
        Ok((
            run_kernel(&kernel, self.name(), &args)?,
            self.out_shape(rows, cols),
        ))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (rows, cols) = l1.shape().dims2()?;
        let args = [(s1, l1), (s2, l2), (s3, l3)];
        let out = self.out_shape(rows, cols);
        let storage = super::layer_norm_cuda::run(self.pass, rows, cols, self.eps, &args)?;
        Ok((storage, out))
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, db) = layer_norm_backward(x, weight, bias, dy, self.eps)?;
        Ok((Some(dx), Some(dw), Some(db)))
    }
}

impl LayerNormOp {
    fn out_shape(&self, rows: usize, cols: usize) -> Shape {
        match self.pass {
            Pass::Stats => (rows, 2).into(),
            _ => (rows, cols).into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Against the composed reference in f64: output and the gradients of x, weight and bias
    /// within 1e-12, for a 3-d input.
    #[test]
    fn fused_layer_norm_equals_the_reference_in_f64() {
        let values = |n: usize, seed: usize| -> Vec<f64> {
            (0..n)
                .map(|i| (((i + seed) * 7919 % 1000) as f64) / 250.0 - 2.0)
                .collect()
        };
        let x = Var::from_tensor(
            &Tensor::from_vec(values(2 * 3 * 10, 1), (2, 3, 10), &Device::Cpu).unwrap(),
        )
        .unwrap();
        let w =
            Var::from_tensor(&Tensor::from_vec(values(10, 2), 10, &Device::Cpu).unwrap()).unwrap();
        let b =
            Var::from_tensor(&Tensor::from_vec(values(10, 3), 10, &Device::Cpu).unwrap()).unwrap();
        let up = Tensor::from_vec(values(60, 4), (2, 3, 10), &Device::Cpu).unwrap();
        let fused = layer_norm(&x, &w, &b, 1e-5).unwrap();
        let reference = layer_norm_reference(&x, &w, &b, 1e-5).unwrap();
        let diff = |a: &Tensor, b: &Tensor| {
            (a - b)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f64>()
                .unwrap()
        };
        assert!(diff(&fused, &reference) < 1e-12);
        let g1 = (&fused * &up)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let g2 = (&reference * &up)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        for (name, v) in [("x", &x), ("w", &w), ("b", &b)] {
            let d = diff(g1.get(v).unwrap(), g2.get(v).unwrap());
            assert!(d < 1e-12, "d{name}: {d}");
        }
    }
}
