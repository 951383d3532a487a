//! Rotary position embeddings (RoPE) applied to the query and key heads of a packed
//! q | k | v projection `[B, T, (heads + 2 kv_heads) · d]`, as Hugging Face's Llama applies
//! them: column i of each head paired with column i + d/2 (`rotate_half`), rotated by the
//! angle `t · inverse[i]` of the row's position t (computed in f32, as Hugging Face computes
//! it); the value heads pass unchanged. The backward is the inverse rotation.
//!
//! The fused op runs on the CPU (f64 inside; 16-bit values in f32) and on CUDA f32, bf16 and
//! f16 tensors (`kernels/rotary.cu`, f32 inside), each result rounded once; CUDA f64 takes
//! [`rotary_packed_reference`], Candle's ops with the cosine and sine tables in the input's
//! type (Hugging Face's own rounding).

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor, D};

use super::packed_attention::PackedHeads;
use super::storage::{run_kernel, uses_kernels_with_half, Arg, CpuKernel, Float};

/// `qkv` with its query and key heads rotated by their rows' positions, differentiable;
/// `inverse` holds the `d / 2` inverse frequencies in f32 on `qkv`'s device.
pub fn rotary_packed(qkv: &Tensor, heads: PackedHeads, inverse: &Tensor) -> Result<Tensor> {
    rotate(qkv, heads, inverse, 1.0)
}

/// The gradient of [`rotary_packed`]'s input from its output's gradient `d_out`, without an
/// autograd graph: the inverse rotation (the angles negated).
pub fn rotary_packed_backward(
    d_out: &Tensor,
    heads: PackedHeads,
    inverse: &Tensor,
) -> Result<Tensor> {
    rotate(&d_out.detach(), heads, inverse, -1.0)
}

/// `x` rotated by `sign` (±1) times its positions' angles: the fused op where it applies (any
/// float type on the CPU; f32 and 16-bit on CUDA), else the reference.
fn rotate(x: &Tensor, heads: PackedHeads, inverse: &Tensor, sign: f32) -> Result<Tensor> {
    let (_, _, width) = x.dims3()?;
    if width != heads.row_width() || inverse.dims() != [heads.head_dim / 2] {
        bail!(
            "rotary_packed: rows of {width} and {:?} inverse frequencies for {heads:?}",
            inverse.dims()
        );
    }
    if inverse.dtype() != DType::F32 || !heads.head_dim.is_multiple_of(2) {
        bail!("rotary_packed: f32 inverse frequencies and an even head width, for {heads:?}");
    }
    let on_cpu = x.device().is_cpu();
    match uses_kernels_with_half(&[x]) && (on_cpu || x.dtype() != DType::F64) {
        true => x.contiguous()?.apply_op2(inverse, Rotary { heads, sign }),
        false if sign < 0.0 => rotary_packed_reference(x, heads, &inverse.neg()?),
        false => rotary_packed_reference(x, heads, inverse),
    }
}

/// The same through Candle's ops: the cosines and sines of the angles (f32; the tables in f32
/// rounded to `qkv`'s type, in f64 for f64),
/// `x cos + rotate_half(x) sin` on each query and key head.
pub fn rotary_packed_reference(
    qkv: &Tensor,
    heads: PackedHeads,
    inverse: &Tensor,
) -> Result<Tensor> {
    let (b, t, _) = qkv.dims3()?;
    let d = heads.head_dim;
    let positions = Tensor::arange(0u32, t as u32, qkv.device())?.to_dtype(DType::F32)?;
    let angles = positions
        .unsqueeze(1)?
        .broadcast_mul(&inverse.to_device(qkv.device())?.unsqueeze(0)?)?;
    let angles = Tensor::cat(&[&angles, &angles], 1)?;
    // f64 takes the cosines of the f32 angles in f64; every other type in f32, then rounded.
    let angles = match qkv.dtype() {
        DType::F64 => angles.to_dtype(DType::F64)?,
        _ => angles,
    };
    let (cos, sin) = (
        angles.cos()?.to_dtype(qkv.dtype())?.unsqueeze(1)?,
        angles.sin()?.to_dtype(qkv.dtype())?.unsqueeze(1)?,
    );
    let rotated_heads = heads.heads + heads.kv_heads;
    let x = qkv
        .narrow(2, 0, rotated_heads * d)?
        .reshape((b, t, rotated_heads, d))?;
    let half = d / 2;
    let swapped = Tensor::cat(
        &[
            &x.narrow(D::Minus1, half, half)?.neg()?,
            &x.narrow(D::Minus1, 0, half)?,
        ],
        D::Minus1,
    )?;
    let out = (x.broadcast_mul(&cos)? + swapped.broadcast_mul(&sin)?)?;
    let values = qkv.narrow(2, rotated_heads * d, heads.kv_heads * d)?;
    Tensor::cat(&[&out.reshape((b, t, rotated_heads * d))?, &values], 2)
}

/// The op: rotation by `sign` times the angles (−1: the backward, the inverse rotation).
struct Rotary {
    heads: PackedHeads,
    sign: f32,
}

struct RotaryKernel {
    heads: PackedHeads,
    seq: usize,
    inverse: Vec<f32>,
    sign: f32,
}

impl CpuKernel for RotaryKernel {
    fn run<T: Float>(&self, args: &[&[T]]) -> Result<Vec<T>> {
        let (width, d) = (self.heads.row_width(), self.heads.head_dim);
        let (rotated, half) = ((self.heads.heads + self.heads.kv_heads) * d, d / 2);
        let mut out = args[0].to_vec();
        for (r, row) in args[0].chunks(width).enumerate() {
            let position = (r % self.seq) as f32;
            for head in (0..rotated).step_by(d) {
                for i in 0..half {
                    let angle = f64::from(position * self.inverse[i]);
                    let (sin, cos) = angle.sin_cos();
                    let sin = sin * f64::from(self.sign);
                    let (x, y) = (row[head + i].to_f64(), row[head + i + half].to_f64());
                    out[r * width + head + i] = T::from_f64(x * cos - y * sin);
                    out[r * width + head + i + half] = T::from_f64(y * cos + x * sin);
                }
            }
        }
        Ok(out)
    }
}

impl CustomOp2 for Rotary {
    fn name(&self) -> &'static str {
        "rotary_packed"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, seq, _) = l1.shape().dims3()?;
        let inverse = match (s2, l2.contiguous_offsets()) {
            (CpuStorage::F32(values), Some((start, end))) => values[start..end].to_vec(),
            _ => bail!("rotary_packed: the inverse frequencies must be contiguous f32"),
        };
        let kernel = RotaryKernel {
            heads: self.heads,
            seq,
            inverse,
            sign: self.sign,
        };
        let args = [Arg::new(s1, l1, "qkv")];
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
        let out = super::rotary_cuda::run(self.heads, self.sign, (s1, l1), (s2, l2))?;
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        _qkv: &Tensor,
        inverse: &Tensor,
        _out: &Tensor,
        d_out: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let d_qkv = rotate(&d_out.detach(), self.heads, inverse, -self.sign)?;
        Ok((Some(d_qkv), None))
    }
}
