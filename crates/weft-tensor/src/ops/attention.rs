//! Causal scaled dot-product attention, fused: `softmax(q kᵀ / sqrt(d) + causal mask) v` for
//! `q, k, v` of shape `[batch, heads, seq, d]`, never materialising the `seq × seq` scores.
//! Forward keeps each row's log-sum-exp `L`; backward recomputes the weights from it
//! (FlashAttention's scheme) in two passes, one over key rows (`dK`, `dV`) and one over query
//! rows (`dQ`), so no pass needs atomics and the results are deterministic.
//!
//! CPU (f32/f64, computed in f64) and CUDA tensors with a kernel for their head width
//! ([`has_cuda_attention`]) run the fused kernels (`attention_cpu.rs`, `kernels/attention.cu`); 16-bit CPU tensors compute in
//! f32; anything else takes [`causal_attention_reference`], Candle's ops over the full scores.

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Tensor, D};

use super::attention_cpu::{AttentionKernel, AttentionPass, AttentionShape};
use super::dropout::Dropout;
use super::storage::{is_half, run_kernel, uses_cpu_kernels, uses_cuda_kernels, widen, Arg};

/// Whether a CUDA kernel exists for head width `d` in `dtype`: 4 to 64 in f32, 4 to 32 in
/// f64 (powers of two).
pub fn has_cuda_attention(dtype: DType, d: usize) -> bool {
    let widest = match dtype {
        DType::F32 => 64,
        DType::F64 => 32,
        _ => return false,
    };
    d.is_power_of_two() && (4..=widest).contains(&d)
}

/// Whether weft's fused kernels take `q`, `k`, `v` of these types and head width (f32/f64 on
/// the CPU; on CUDA, [`has_cuda_attention`]).
pub(crate) fn fused_kernels_apply(qkv: &[&Tensor; 3]) -> bool {
    let d = qkv[0].dims().last().copied().unwrap_or(0);
    uses_cpu_kernels(qkv) || (uses_cuda_kernels(qkv) && has_cuda_attention(qkv[0].dtype(), d))
}

/// Causal attention of `q`, `k`, `v` (`[batch, heads, seq, d]`), differentiable.
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let (_, _, _, d) = q.dims4()?;
    if k.dims() != q.dims() || v.dims() != q.dims() {
        bail!(
            "causal_attention: q {:?}, k {:?} and v {:?} must have one shape",
            q.dims(),
            k.dims(),
            v.dims()
        );
    }
    if is_half(&[q, k, v]) {
        return causal_attention(&widen(q)?, &widen(k)?, &widen(v)?)?.to_dtype(q.dtype());
    }
    if !fused_kernels_apply(&[q, k, v]) {
        return causal_attention_reference(q, k, v, None);
    }
    let op = AttentionOp {
        pass: AttentionPass::Forward,
        scale: 1.0 / (d as f64).sqrt(),
    };
    let packed = q
        .contiguous()?
        .apply_op3(&k.contiguous()?, &v.contiguous()?, op)?;
    packed.narrow(3, 0, d)
}

/// The same attention through Candle's ops over the full `seq × seq` scores (16-bit scores
/// normalised in f32), with `dropout` of the attention weights (training only; the weights
/// `[B, H, T, T]` placed among all the model's heads as `dropout` says): the reference the
/// fused kernels are tested against, and the path of dropout.
pub fn causal_attention_reference(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    dropout: Option<&Dropout>,
) -> Result<Tensor> {
    let (_, _, t, d) = q.dims4()?;
    let scores = (q.matmul(&k.t()?.contiguous()?)? * (1.0 / (d as f64).sqrt()))?;
    let narrow = matches!(scores.dtype(), DType::BF16 | DType::F16);
    let scores = if narrow {
        scores.to_dtype(DType::F32)?
    } else {
        scores
    };
    let masked = scores.broadcast_add(&causal_mask(t, scores.dtype(), q.device())?)?;
    let mut weights = softmax_last_dim(&masked)?;
    if narrow {
        weights = weights.to_dtype(q.dtype())?;
    }
    if let Some(dropout) = dropout {
        weights = super::dropout::dropout(&weights, dropout)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    }
    weights.matmul(&v.contiguous()?)
}

/// The fused forward without an autograd graph, for blocks that differentiate themselves:
/// the output and what [`causal_attention_backward`] needs (the output packed with each row's
/// log-sum-exp). `None` where the fused kernels do not apply ([`has_cuda_attention`]; 16-bit).
pub fn causal_attention_saving(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
) -> Result<Option<(Tensor, Tensor)>> {
    let (_, _, _, d) = q.dims4()?;
    if is_half(&[q, k, v]) {
        // In f32; the output rounded back, the packed statistics kept in f32.
        let wide = causal_attention_saving(&widen(q)?, &widen(k)?, &widen(v)?)?;
        return wide
            .map(|(out, packed)| Ok((out.to_dtype(q.dtype())?, packed)))
            .transpose();
    }
    if !fused_kernels_apply(&[q, k, v]) || k.dims() != q.dims() || v.dims() != q.dims() {
        return Ok(None);
    }
    let op = AttentionOp {
        pass: AttentionPass::Forward,
        scale: 1.0 / (d as f64).sqrt(),
    };
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    let packed = q.apply_op3_no_bwd(&k, &v, &op)?;
    Ok(Some((packed.narrow(3, 0, d)?, packed)))
}

/// The gradients `(dq, dk, dv)` of the fused attention from what [`causal_attention_saving`]
/// kept (`packed`) and the output's gradient `d_out`.
pub fn causal_attention_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    packed: &Tensor,
    d_out: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    if is_half(&[q, k, v, d_out]) {
        let (dq, dk, dv) =
            causal_attention_backward(&widen(q)?, &widen(k)?, &widen(v)?, packed, &widen(d_out)?)?;
        let narrow = |t: Tensor| t.to_dtype(q.dtype());
        return Ok((narrow(dq)?, narrow(dk)?, narrow(dv)?));
    }
    let scale = 1.0 / (q.dim(3)? as f64).sqrt();
    backward_packed(q, k, v, packed, d_out, scale)
}

/// FlashAttention's backward in two passes: key rows (`dK`, `dV`), then query rows (`dQ`).
fn backward_packed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    packed: &Tensor,
    d_out: &Tensor,
    scale: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let d = q.dim(3)?;
    let (o, lse) = (packed.narrow(3, 0, d)?, packed.narrow(3, d, 1)?);
    let delta = (d_out * &o)?.sum_keepdim(3)?;
    let q_do = Tensor::cat(&[q, d_out], 3)?.contiguous()?;
    let kv = Tensor::cat(&[k, v], 3)?.contiguous()?;
    let stats = Tensor::cat(&[&lse, &delta], 3)?.contiguous()?;
    let pass = |pass| AttentionOp { pass, scale };
    let dkv = q_do.apply_op3_no_bwd(&kv, &stats, &pass(AttentionPass::KeyValueGrads))?;
    let dq = q_do.apply_op3_no_bwd(&kv, &stats, &pass(AttentionPass::QueryGrads))?;
    Ok((dq, dkv.narrow(3, 0, d)?, dkv.narrow(3, d, d)?))
}

fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let exp = x.broadcast_sub(&max)?.exp()?;
    exp.broadcast_div(&exp.sum_keepdim(D::Minus1)?)
}

/// `[T, T]`: 0 where a position may attend (itself and earlier ones), −∞ above the diagonal.
pub(crate) fn causal_mask(t: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    let values: Vec<f32> = (0..t * t)
        .map(|i| match i % t > i / t {
            true => f32::NEG_INFINITY,
            false => 0.0,
        })
        .collect();
    Tensor::from_vec(values, (t, t), device)?.to_dtype(dtype)
}

/// One pass of the fused attention; the forward pass is differentiable (its backward runs the
/// two gradient passes).
#[derive(Debug, Clone, Copy)]
struct AttentionOp {
    pass: AttentionPass,
    scale: f64,
}

impl AttentionOp {
    /// The call's shape from the first argument's layout, and the output's shape.
    fn shapes(&self, first: &Layout) -> Result<(AttentionShape, Shape)> {
        let (b, h, t, last) = first.shape().dims4()?;
        let width = match self.pass {
            AttentionPass::Forward => last,
            _ => last / 2,
        };
        let out = match self.pass {
            AttentionPass::Forward => width + 1,
            AttentionPass::KeyValueGrads => 2 * width,
            AttentionPass::QueryGrads => width,
        };
        let shape = AttentionShape {
            planes: b * h,
            seq: t,
            width,
            scale: self.scale,
        };
        Ok((shape, (b, h, t, out).into()))
    }
}

impl CustomOp3 for AttentionOp {
    fn name(&self) -> &'static str {
        match self.pass {
            AttentionPass::Forward => "attention_forward",
            AttentionPass::KeyValueGrads => "attention_backward_kv",
            AttentionPass::QueryGrads => "attention_backward_q",
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
        let (shape, out) = self.shapes(l1)?;
        let kernel = AttentionKernel {
            pass: self.pass,
            shape,
        };
        let arg = Arg::new;
        let args = [arg(s1, l1, "a"), arg(s2, l2, "b"), arg(s3, l3, "c")];
        Ok((run_kernel(&kernel, self.name(), &args)?, out))
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
        let (shape, out) = self.shapes(l1)?;
        let args = [(s1, l1), (s2, l2), (s3, l3)];
        let storage = super::attention_cuda::run(self.pass, shape, &args, out.elem_count())?;
        Ok((storage, out))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        packed: &Tensor,
        dpacked: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let d_out = dpacked.narrow(3, 0, q.dim(3)?)?;
        let (dq, dk, dv) = backward_packed(q, k, v, packed, &d_out, self.scale)?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    fn values(shape: (usize, usize, usize, usize), seed: u64) -> Tensor {
        let n = shape.0 * shape.1 * shape.2 * shape.3;
        let v: Vec<f64> = (0..n)
            .map(|i| ((i as u64 * 7919 + seed * 104_729) % 1000) as f64 / 250.0 - 2.0)
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    }

    /// The fused kernels against the full-score reference in f64: outputs and the gradients of
    /// q, k and v within 1e-12 (the same sums in another order), for widths with and without a
    /// CUDA kernel and sequences shorter and longer than a CUDA tile.
    #[test]
    fn fused_attention_equals_the_reference_in_f64() {
        for (shape, seed) in [((2, 3, 5, 4), 1), ((1, 2, 70, 8), 2), ((1, 1, 3, 6), 3)] {
            let vars: Vec<Var> = (0..3)
                .map(|i| Var::from_tensor(&values(shape, seed * 3 + i)).unwrap())
                .collect();
            let (q, k, v) = (
                vars[0].as_tensor(),
                vars[1].as_tensor(),
                vars[2].as_tensor(),
            );
            let upstream = values(shape, 99);
            let fused = causal_attention(q, k, v).unwrap();
            let reference = causal_attention_reference(q, k, v, None).unwrap();
            assert!(max_diff(&fused, &reference) < 1e-12, "{shape:?}: output");
            let g1 = (&fused * &upstream)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let g2 = (&reference * &upstream)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            for (name, var) in ["q", "k", "v"].iter().zip(&vars) {
                let (a, b) = (
                    g1.get(var.as_tensor()).unwrap(),
                    g2.get(var.as_tensor()).unwrap(),
                );
                assert!(
                    max_diff(a, b) < 1e-12,
                    "{shape:?}: d{name} {}",
                    max_diff(a, b)
                );
            }
        }
    }

    /// Position 0 attends only to itself; equal scores average the values of the past.
    #[test]
    fn rows_attend_to_their_past_by_hand() {
        let zeros = Tensor::zeros((1, 1, 3, 2), DType::F64, &Device::Cpu).unwrap();
        let v = Tensor::new(&[[[[1f64, 10.], [3., 20.], [8., 60.]]]], &Device::Cpu).unwrap();
        let y = causal_attention(&zeros, &zeros, &v).unwrap();
        let y: Vec<Vec<f64>> = y.squeeze(0).unwrap().squeeze(0).unwrap().to_vec2().unwrap();
        assert_eq!(y[0], [1.0, 10.0]);
        assert_eq!(y[1], [2.0, 15.0]);
        assert!((y[2][0] - 4.0).abs() < 1e-12 && (y[2][1] - 30.0).abs() < 1e-12);
    }
}
