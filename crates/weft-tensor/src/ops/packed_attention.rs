//! Causal attention over a packed q | k | v projection, graph-free (for blocks that
//! differentiate themselves): the forward from `[batch, seq, (heads + 2 kv_heads) · head_dim]`
//! rows to the output rows `[batch, seq, heads · head_dim]` and each query row's log-sum-exp
//! (`[batch, heads, seq]`, f32 or f64), the backward from those to the projection's gradient in
//! its own layout. Grouped-query attention (fewer key/value heads) reads key/value head
//! `h / (heads / kv_heads)` for query head `h`, as Hugging Face's `repeat_kv`.
//!
//! Three paths: 16-bit tensors on a GPU run cuDNN's fused flash attention on the packed rows
//! in place (`sdpa_cudnn`, feature `cudnn`); tensors weft's fused kernels cover run them on
//! split heads ([`super::causal_attention_saving`]: the CPU in f64 inside, CUDA f32 up to head
//! width 64), 16-bit ones widened to f32; anything else computes the same with Candle's ops
//! over the full scores (the reference, widened to f32 from 16 bits). All three keep the
//! log-sum-exp, never the `seq × seq` weights.

use candle_core::{DType, Result, Tensor, D};

use super::attention::{
    causal_attention_backward, causal_attention_saving, causal_mask, fused_kernels_apply,
};
use super::storage::{is_half, widen};

/// The heads of a packed q | k | v projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PackedHeads {
    /// Query heads (and output heads).
    pub heads: usize,
    /// Key and value heads: `heads`, or a divisor of it for grouped-query attention.
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl PackedHeads {
    /// Elements in a row of the packed projection.
    pub fn row_width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }

    /// Elements in a row of the output.
    pub fn out_width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Where queries, keys and values start in a packed row.
    pub fn offsets(&self) -> [usize; 3] {
        let d = self.head_dim;
        [0, self.heads * d, (self.heads + self.kv_heads) * d]
    }

    pub(crate) fn check(&self, qkv: &Tensor) -> Result<(usize, usize)> {
        let (b, t, width) = qkv.dims3()?;
        let fits = self.kv_heads > 0
            && self.head_dim > 0
            && self.heads.is_multiple_of(self.kv_heads)
            && width == self.row_width();
        if !fits {
            candle_core::bail!(
                "packed attention: rows of {width} for {} query and {} key/value heads of {}",
                self.heads,
                self.kv_heads,
                self.head_dim
            );
        }
        Ok((b, t))
    }
}

/// `softmax(q kᵀ / sqrt(head_dim) + causal mask) v` per head of the packed rows `qkv`
/// (`[batch, seq, row_width]`): the output rows and each query row's log-sum-exp.
pub fn packed_causal_attention(qkv: &Tensor, heads: PackedHeads) -> Result<(Tensor, Tensor)> {
    heads.check(qkv)?;
    #[cfg(feature = "cudnn")]
    if super::storage::uses_cuda_kernels_with_half(&[qkv]) {
        if let Some(fused) = super::sdpa_cudnn::forward(&qkv.contiguous()?, heads, None)? {
            return Ok(fused);
        }
    }
    if is_half(&[qkv]) {
        let (out, lse) = packed_causal_attention(&widen(qkv)?, heads)?;
        return Ok((out.to_dtype(qkv.dtype())?, lse));
    }
    let [q, k, v] = split(qkv, heads)?;
    let (k, v) = (repeat_kv(&k, heads)?, repeat_kv(&v, heads)?);
    let (out, lse) = match causal_attention_saving(&q, &k, &v)? {
        Some((out, packed)) => (out, packed.narrow(3, heads.head_dim, 1)?.squeeze(3)?),
        None => reference_forward(&q, &k, &v)?,
    };
    Ok((merge(&out)?, lse.contiguous()?))
}

/// The gradient of the packed rows `qkv` (`[batch, seq, row_width]`) from the forward's `out`
/// and `lse` and the output's gradient `d_out`.
pub fn packed_causal_attention_backward(
    qkv: &Tensor,
    out: &Tensor,
    lse: &Tensor,
    d_out: &Tensor,
    heads: PackedHeads,
) -> Result<Tensor> {
    heads.check(qkv)?;
    #[cfg(feature = "cudnn")]
    if super::storage::uses_cuda_kernels_with_half(&[qkv, out, d_out]) {
        let (out, d_out) = (out.contiguous()?, d_out.contiguous()?);
        let fused = super::sdpa_cudnn::backward(
            &qkv.contiguous()?,
            &out,
            &lse.contiguous()?,
            &d_out,
            heads,
            None,
        )?;
        if let Some(d_qkv) = fused {
            return Ok(d_qkv);
        }
    }
    if is_half(&[qkv, out, d_out]) {
        let wide = [qkv, out, d_out].map(widen);
        let [qkv_w, out_w, d_out_w] = wide;
        let d_qkv = packed_causal_attention_backward(
            &qkv_w?,
            &out_w?,
            &lse.to_dtype(DType::F32)?,
            &d_out_w?,
            heads,
        )?;
        return d_qkv.to_dtype(qkv.dtype());
    }
    let [q, k, v] = split(qkv, heads)?;
    let (k_full, v_full) = (repeat_kv(&k, heads)?, repeat_kv(&v, heads)?);
    let o = heads_of(out, heads.heads, heads.head_dim)?;
    let d_o = heads_of(d_out, heads.heads, heads.head_dim)?;
    let lse = lse.to_dtype(q.dtype())?;
    let (dq, dk, dv) = match fused_kernels_apply(&[&q, &k_full, &v_full]) {
        true => {
            let packed = Tensor::cat(&[&o, &lse.unsqueeze(3)?], 3)?.contiguous()?;
            causal_attention_backward(&q, &k_full, &v_full, &packed, &d_o)?
        }
        false => reference_backward(&q, &k_full, &v_full, &o, &lse, &d_o)?,
    };
    let (dk, dv) = (sum_groups(&dk, heads)?, sum_groups(&dv, heads)?);
    Tensor::cat(&[merge(&dq)?, merge(&dk)?, merge(&dv)?], D::Minus1)
}

/// `[batch, seq, row_width]` rows to q `[batch, heads, seq, d]` and k, v
/// `[batch, kv_heads, seq, d]`, contiguous.
fn split(qkv: &Tensor, heads: PackedHeads) -> Result<[Tensor; 3]> {
    let d = heads.head_dim;
    let [q, k, v] = heads.offsets();
    let part = |at: usize, count: usize| -> Result<Tensor> {
        heads_of(&qkv.narrow(2, at, count * d)?, count, d)
    };
    Ok([
        part(q, heads.heads)?,
        part(k, heads.kv_heads)?,
        part(v, heads.kv_heads)?,
    ])
}

/// `[batch, seq, count · d]` to `[batch, count, seq, d]`, contiguous.
fn heads_of(x: &Tensor, count: usize, d: usize) -> Result<Tensor> {
    let (b, t, _) = x.dims3()?;
    x.reshape((b, t, count, d))?.transpose(1, 2)?.contiguous()
}

/// `[batch, count, seq, d]` to `[batch, seq, count · d]`.
fn merge(x: &Tensor) -> Result<Tensor> {
    let (b, count, t, d) = x.dims4()?;
    x.transpose(1, 2)?.contiguous()?.reshape((b, t, count * d))
}

/// Key/value heads repeated for their groups of query heads (`[batch, heads, seq, d]`).
fn repeat_kv(x: &Tensor, heads: PackedHeads) -> Result<Tensor> {
    let group = heads.heads / heads.kv_heads;
    if group == 1 {
        return Ok(x.clone());
    }
    let (b, kv, t, d) = x.dims4()?;
    x.unsqueeze(2)?
        .broadcast_as((b, kv, group, t, d))?
        .reshape((b, kv * group, t, d))
}

/// The sum of a full-head gradient over each group of query heads (`[batch, kv_heads, seq, d]`).
fn sum_groups(x: &Tensor, heads: PackedHeads) -> Result<Tensor> {
    let group = heads.heads / heads.kv_heads;
    if group == 1 {
        return Ok(x.clone());
    }
    let (b, _, t, d) = x.dims4()?;
    x.reshape((b, heads.kv_heads, group, t, d))?.sum(2)
}

/// The scaled, masked scores `q kᵀ / sqrt(d) + mask` (`[batch, heads, seq, seq]`).
fn scores(q: &Tensor, k: &Tensor) -> Result<Tensor> {
    let (_, _, t, d) = q.dims4()?;
    let s = (q.matmul(&k.t()?.contiguous()?)? * (1.0 / (d as f64).sqrt()))?;
    s.broadcast_add(&causal_mask(t, s.dtype(), q.device())?)
}

/// The forward through Candle's ops: output heads and log-sum-exp.
fn reference_forward(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
    let s = scores(q, k)?;
    let max = s.max_keepdim(D::Minus1)?;
    let lse = (s
        .broadcast_sub(&max)?
        .exp()?
        .sum_keepdim(D::Minus1)?
        .log()?
        + &max)?;
    let weights = s.broadcast_sub(&lse)?.exp()?;
    Ok((weights.matmul(&v.contiguous()?)?, lse.squeeze(3)?))
}

/// The backward through Candle's ops: the weights recomputed from `lse`, then
/// `dV = Pᵀ dO`, `dS = P (dO Vᵀ − Σ dO·O)`, `dQ = dS K / sqrt(d)`, `dK = dSᵀ Q / sqrt(d)`.
fn reference_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    lse: &Tensor,
    d_o: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let scale = 1.0 / (q.dim(3)? as f64).sqrt();
    let weights = scores(q, k)?.broadcast_sub(&lse.unsqueeze(3)?)?.exp()?;
    let dv = weights.t()?.matmul(d_o)?;
    let dp = d_o.matmul(&v.t()?)?;
    let row_dot = (d_o * o)?.sum_keepdim(D::Minus1)?;
    let ds = (weights * dp.broadcast_sub(&row_dot)?)?;
    let dq = (ds.matmul(k)? * scale)?;
    let dk = (ds.t()?.matmul(q)? * scale)?;
    Ok((dq, dk, dv))
}

#[cfg(test)]
mod tests;
