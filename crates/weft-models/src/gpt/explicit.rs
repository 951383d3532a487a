//! The transformer layer's halves' own backward ([`ExplicitBackward`]): each forward runs graph-free
//! through weft-tensor's fused kernels (LayerNorm, attention, GELU) and matmuls, keeping the
//! tensors its backward reads, and its backward is written out, each gradient computed
//! once. Under Candle's autograd every intermediate gradient is first added into a zero-filled
//! accumulator, a pass over each activation that this avoids.
//!
//! It applies when a half's projections are affine ([`Affine`]: whole Conv1Ds, or
//! tensor-parallel slices whose sums over the ranks it issues itself: one all-reduce after each
//! row-split projection forward, one of each column-split projection's input gradient
//! backward), nothing is dropped, and the fused kernels cover the tensors (f32/f64 on the CPU,
//! and on a GPU the attention kernels' head widths); otherwise the tape records Candle's graph.

use candle_core::{Tensor, D};
use weft_tensor::{ops, Mode, Result};
use weft_tensor::{ExplicitBackward, ExplicitGrads, Saved, TensorError};

use super::blocks::{AttentionBlock, MlpBlock};
use super::parts::{Affine, AffineSplit};

/// `x W + b` over rows (a row-split product summed over the ranks first).
fn affine(x: &Tensor, layer: Affine<'_>) -> Result<Tensor> {
    let mut product = x.matmul(&layer.weight.detach())?;
    if let AffineSplit::Rows(sum) = layer.split {
        product = sum.sum(&product)?;
    }
    Ok(ops::add_bias(&product, &layer.bias.detach())?)
}

/// The gradients of `x W + b` from `dy`: `(dx, dW, db)` (`xᵀ` a transposed view: the GEMM reads
/// it transposed, no copy); a column-split layer's `dx` summed over the ranks.
fn affine_backward(x: &Tensor, layer: Affine<'_>, dy: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let mut dx = dy.matmul(&layer.weight.detach().t()?)?;
    if let AffineSplit::Columns(sum) = layer.split {
        dx = sum.sum(&dx)?;
    }
    let dw = x.t()?.matmul(dy)?;
    Ok((dx, dw, ops::column_sums(dy)?))
}

/// `[B·T, 3C]` fused q | k | v to three `[B, heads, T, head_dim]` tensors.
fn split_heads(qkv: &Tensor, b: usize, t: usize, head_dim: usize) -> Result<Vec<Tensor>> {
    let width = qkv.dim(1)? / 3;
    (0..3)
        .map(|i| {
            Ok(qkv
                .narrow(1, i * width, width)?
                .reshape((b, t, width / head_dim, head_dim))?
                .transpose(1, 2)?
                .contiguous()?)
        })
        .collect()
}

/// `[B, heads, T, head_dim]` back to `[B·T, heads·head_dim]`.
fn merge_heads(y: &Tensor) -> Result<Tensor> {
    let (b, h, t, d) = y.dims4()?;
    Ok(y.transpose(1, 2)?.contiguous()?.reshape((b * t, h * d))?)
}

/// The saved tensors of `block`'s forward, as the array its backward reads.
fn unpack<const N: usize>(saved: Saved, block: &str) -> Result<[Tensor; N]> {
    saved.try_into().map_err(|_| TensorError::Block {
        block: block.into(),
        message: "its backward got the wrong saved tensors".into(),
    })
}

/// `[B, T, C]` to `[B·T, C]` rows, contiguous.
fn rows(x: &Tensor) -> Result<Tensor> {
    let (b, t, c) = x.dims3()?;
    Ok(x.reshape((b * t, c))?.contiguous()?)
}

impl AttentionBlock {
    /// The two projections as affine maps, when they are.
    fn affines(&self) -> Option<[Affine<'_>; 2]> {
        Some([self.c_attn.affine()?, self.attn_proj.affine()?])
    }
}

impl ExplicitBackward for AttentionBlock {
    fn forward_saving(&self, x: &Tensor, mode: Mode) -> Result<Option<(Tensor, Saved)>> {
        let Some([c_attn, attn_proj]) = self.affines() else {
            return Ok(None);
        };
        if mode.train && self.dropout > 0.0 {
            return Ok(None);
        }
        let (b, t, c) = x.dims3()?;
        let h = rows(x)?;
        let (w1, b1) = (self.ln_1.weight().detach(), self.ln_1.bias().detach());
        let ln_1 = ops::layer_norm(&h, &w1, &b1, self.ln_1.eps())?;
        let qkv = affine(&ln_1, c_attn)?;
        let heads = split_heads(&qkv, b, t, self.head_dim)?;
        let Some((attended, packed)) =
            ops::causal_attention_saving(&heads[0], &heads[1], &heads[2])?
        else {
            return Ok(None);
        };
        let attended = merge_heads(&attended)?;
        let out = (&h + affine(&attended, attn_proj)?)?;
        let [q, k, v]: [Tensor; 3] = heads.try_into().expect("three parts");
        let saved = vec![h, ln_1, q, k, v, packed, attended];
        Ok(Some((out.reshape((b, t, c))?, saved)))
    }

    fn backward(&self, saved: Saved, dy: &Tensor, input_grad: bool) -> Result<ExplicitGrads> {
        let [c_attn, attn_proj] = self
            .affines()
            .expect("forward_saving kept tensors only for affine projections");
        let [h, ln_1, q, k, v, packed, attended] = unpack(saved, &self.name)?;
        let (b, t, c) = dy.dims3()?;
        let d_out = rows(dy)?;
        let (d_attended, d_w_proj, d_b_proj) = affine_backward(&attended, attn_proj, &d_out)?;
        let (bh, heads, _, hd) = q.dims4()?;
        let d_attended = d_attended
            .reshape((bh, t, heads, hd))?
            .transpose(1, 2)?
            .contiguous()?;
        let (dq, dk, dv) = ops::causal_attention_backward(&q, &k, &v, &packed, &d_attended)?;
        let d_qkv = Tensor::cat(
            &[merge_heads(&dq)?, merge_heads(&dk)?, merge_heads(&dv)?],
            D::Minus1,
        )?;
        let (d_ln_1, d_w_qkv, d_b_qkv) = affine_backward(&ln_1, c_attn, &d_qkv)?;
        let (w1, b1) = (self.ln_1.weight().detach(), self.ln_1.bias().detach());
        let (d_h, d_w1, d_b1) = ops::layer_norm_backward(&h, &w1, &b1, &d_ln_1, self.ln_1.eps())?;
        let input = match input_grad {
            true => Some((d_h + d_out)?.reshape((b, t, c))?),
            false => None,
        };
        let params = vec![
            (self.ln_1.weight().id(), d_w1),
            (self.ln_1.bias().id(), d_b1),
            (c_attn.weight.id(), d_w_qkv),
            (c_attn.bias.id(), d_b_qkv),
            (attn_proj.weight.id(), d_w_proj),
            (attn_proj.bias.id(), d_b_proj),
        ];
        Ok(ExplicitGrads { input, params })
    }
}

impl MlpBlock {
    /// The two projections as affine maps, when they are.
    fn affines(&self) -> Option<[Affine<'_>; 2]> {
        Some([self.c_fc.affine()?, self.mlp_proj.affine()?])
    }
}

impl ExplicitBackward for MlpBlock {
    fn forward_saving(&self, x: &Tensor, mode: Mode) -> Result<Option<(Tensor, Saved)>> {
        let Some([c_fc, mlp_proj]) = self.affines() else {
            return Ok(None);
        };
        if mode.train && self.dropout > 0.0 {
            return Ok(None);
        }
        let (b, t, c) = x.dims3()?;
        let h = rows(x)?;
        let (w2, b2) = (self.ln_2.weight().detach(), self.ln_2.bias().detach());
        let ln_2 = ops::layer_norm(&h, &w2, &b2, self.ln_2.eps())?;
        let up = affine(&ln_2, c_fc)?;
        let act = ops::gelu_tanh(&up)?;
        let out = (&h + affine(&act, mlp_proj)?)?;
        Ok(Some((out.reshape((b, t, c))?, vec![h, ln_2, up, act])))
    }

    fn backward(&self, saved: Saved, dy: &Tensor, input_grad: bool) -> Result<ExplicitGrads> {
        let [c_fc, mlp_proj] = self
            .affines()
            .expect("forward_saving kept tensors only for affine projections");
        let [h, ln_2, up, act] = unpack(saved, &self.name)?;
        let (b, t, c) = dy.dims3()?;
        let d_out = rows(dy)?;
        let (d_act, d_w_down, d_b_down) = affine_backward(&act, mlp_proj, &d_out)?;
        let d_up = ops::gelu_tanh_backward(&up, &d_act)?;
        let (d_ln_2, d_w_up, d_b_up) = affine_backward(&ln_2, c_fc, &d_up)?;
        let (w2, b2) = (self.ln_2.weight().detach(), self.ln_2.bias().detach());
        let (d_h, d_w2, d_b2) = ops::layer_norm_backward(&h, &w2, &b2, &d_ln_2, self.ln_2.eps())?;
        let input = match input_grad {
            true => Some((d_h + d_out)?.reshape((b, t, c))?),
            false => None,
        };
        let params = vec![
            (self.ln_2.weight().id(), d_w2),
            (self.ln_2.bias().id(), d_b2),
            (c_fc.weight.id(), d_w_up),
            (c_fc.bias.id(), d_b_up),
            (mlp_proj.weight.id(), d_w_down),
            (mlp_proj.bias.id(), d_b_down),
        ];
        Ok(ExplicitGrads { input, params })
    }
}
