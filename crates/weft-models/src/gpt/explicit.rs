//! The transformer layer's halves' own backward ([`ExplicitBackward`]): each forward runs graph-free
//! through weft-tensor's fused kernels (LayerNorm, attention, GELU) and matmuls, keeping the
//! tensors its backward reads, and its backward is written out, each gradient computed
//! once. Under Candle's autograd every intermediate gradient is first added into a zero-filled
//! accumulator, a pass over each activation that this avoids.
//!
//! The attention reads its heads in place from the fused q | k | v projection and writes its
//! gradient in that layout ([`ops::packed_causal_attention`]: cuDNN's flash attention for
//! 16-bit data on a GPU), keeping each query row's log-sum-exp, never the weights.
//!
//! It applies when a half's projections are affine ([`Affine`]: whole Conv1Ds, or
//! tensor-parallel slices whose sums over the ranks it issues itself: one all-reduce after each
//! row-split projection forward, one of each column-split projection's input gradient
//! backward); otherwise the tape records Candle's graph. With dropout, the output projection's
//! dropout is drawn again from the forward's seeds (kept with the saved tensors) for the
//! gradient, and the attention weights' is cuDNN's, inside the fused attention (16-bit data on
//! a GPU; elsewhere the tape records the graph of the reference attention over the weights).

use candle_core::Tensor;
use weft_tensor::ops::{DroppedAttention, PackedHeads};
use weft_tensor::{ops, Mode, Result};
use weft_tensor::{ExplicitBackward, ExplicitGrads, Saved, TensorError};

use super::blocks::{AttentionBlock, MlpBlock};
use super::dropout::{dropout, mode_of, saved_seeds, Site};
use super::parts::{Affine, AffineSplit};

/// `x W` over rows (a row-split product summed over the ranks).
fn product(x: &Tensor, layer: Affine<'_>) -> Result<Tensor> {
    let product = x.matmul(&layer.weight.detach())?;
    match layer.split {
        AffineSplit::Rows(sum) => sum.sum(&product),
        _ => Ok(product),
    }
}

/// `x W + b` over rows.
fn affine(x: &Tensor, layer: Affine<'_>) -> Result<Tensor> {
    Ok(ops::add_bias(&product(x, layer)?, &layer.bias.detach())?)
}

/// `residual + x W + b` over rows: a half's output, its input added with the bias in one pass.
fn affine_onto(x: &Tensor, layer: Affine<'_>, residual: &Tensor) -> Result<Tensor> {
    let bias = layer.bias.detach();
    Ok(ops::add_bias_residual(
        &product(x, layer)?,
        &bias,
        residual,
    )?)
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

    /// The heads of a fused q | k | v projection `width` wide (this rank's, under tensor
    /// parallelism).
    fn packed_heads(&self, width: usize) -> PackedHeads {
        let heads = width / (3 * self.head_dim);
        PackedHeads {
            heads,
            kv_heads: heads,
            head_dim: self.head_dim,
        }
    }
}

impl ExplicitBackward for AttentionBlock {
    fn forward_saving(&self, x: &Tensor, mode: Mode) -> Result<Option<(Tensor, Saved)>> {
        let Some([c_attn, attn_proj]) = self.affines() else {
            return Ok(None);
        };
        let (b, t, c) = x.dims3()?;
        let h = rows(x)?;
        let (w1, b1) = (self.ln_1.weight().detach(), self.ln_1.bias().detach());
        let ln_1 = ops::layer_norm(&h, &w1, &b1, self.ln_1.eps())?;
        let qkv = affine(&ln_1, c_attn)?;
        let heads = self.packed_heads(qkv.dim(1)?);
        let sequences = qkv.reshape((b, t, ()))?;
        let Some(weights_dropout) = self.weights_dropout(mode) else {
            let (attended, lse) = ops::packed_causal_attention(&sequences, heads)?;
            let attended = attended.reshape((b * t, ()))?;
            let out = affine_onto(&attended, attn_proj, &h)?;
            let saved = vec![h, ln_1, qkv, attended, lse];
            return Ok(Some((out.reshape((b, t, c))?, saved)));
        };
        let Some(dropped) =
            ops::packed_causal_attention_with_dropout(&sequences, heads, &weights_dropout)?
        else {
            return Ok(None);
        };
        let attended = dropped.out.reshape((b * t, ()))?;
        let projected = affine(&attended, attn_proj)?;
        let site = Site::AttentionOutput;
        let out = ops::residual_add(
            &h,
            &dropout(projected, self.dropout, mode, &self.name, site)?,
        )?;
        let saved = vec![
            h,
            ln_1,
            qkv,
            attended,
            dropped.lse,
            dropped.philox,
            saved_seeds(mode)?,
        ];
        Ok(Some((out.reshape((b, t, c))?, saved)))
    }

    fn backward(&self, saved: Saved, dy: &Tensor, input_grad: bool) -> Result<ExplicitGrads> {
        let [c_attn, attn_proj] = self
            .affines()
            .expect("forward_saving kept tensors only for affine projections");
        let (b, t, c) = dy.dims3()?;
        let d_out = rows(dy)?;
        let as_sequences = |x: &Tensor| x.reshape((b, t, ()));
        let heads = |qkv: &Tensor| -> Result<PackedHeads> { Ok(self.packed_heads(qkv.dim(1)?)) };
        let (h, ln_1, d_qkv, d_w_proj, d_b_proj) = match saved.len() {
            7 => {
                let [h, ln_1, qkv, attended, lse, philox, seeds] = unpack(saved, &self.name)?;
                let mode = mode_of(&seeds, &self.name)?;
                let site = Site::AttentionOutput;
                let d_projected = dropout(d_out.clone(), self.dropout, mode, &self.name, site)?;
                let (d_attended, d_w, d_b) = affine_backward(&attended, attn_proj, &d_projected)?;
                let out = as_sequences(&attended)?;
                let dropped = DroppedAttention { out, lse, philox };
                let d_qkv = ops::packed_causal_attention_with_dropout_backward(
                    &as_sequences(&qkv)?,
                    &dropped,
                    &as_sequences(&d_attended)?,
                    heads(&qkv)?,
                    self.dropout,
                )?;
                (h, ln_1, d_qkv, d_w, d_b)
            }
            _ => {
                let [h, ln_1, qkv, attended, lse] = unpack(saved, &self.name)?;
                let (d_attended, d_w, d_b) = affine_backward(&attended, attn_proj, &d_out)?;
                let d_qkv = ops::packed_causal_attention_backward(
                    &as_sequences(&qkv)?,
                    &as_sequences(&attended)?,
                    &lse,
                    &as_sequences(&d_attended)?,
                    heads(&qkv)?,
                )?;
                (h, ln_1, d_qkv, d_w, d_b)
            }
        };
        let d_qkv = d_qkv.reshape((b * t, ()))?;
        let (d_ln_1, d_w_qkv, d_b_qkv) = affine_backward(&ln_1, c_attn, &d_qkv)?;
        let (w1, b1) = (self.ln_1.weight().detach(), self.ln_1.bias().detach());
        let (d_h, d_w1, d_b1) = ops::layer_norm_backward(&h, &w1, &b1, &d_ln_1, self.ln_1.eps())?;
        let input = match input_grad {
            true => Some(ops::residual_add(&d_h, &d_out)?.reshape((b, t, c))?),
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
        let (b, t, c) = x.dims3()?;
        let h = rows(x)?;
        let (w2, b2) = (self.ln_2.weight().detach(), self.ln_2.bias().detach());
        let ln_2 = ops::layer_norm(&h, &w2, &b2, self.ln_2.eps())?;
        let up = affine(&ln_2, c_fc)?;
        let act = ops::gelu_tanh(&up)?;
        if !(mode.train && self.dropout > 0.0) {
            let out = affine_onto(&act, mlp_proj, &h)?;
            return Ok(Some((out.reshape((b, t, c))?, vec![h, ln_2, up, act])));
        }
        let down = affine(&act, mlp_proj)?;
        let dropped = dropout(down, self.dropout, mode, &self.name, Site::MlpOutput)?;
        let out = ops::residual_add(&h, &dropped)?;
        let saved = vec![h, ln_2, up, act, saved_seeds(mode)?];
        Ok(Some((out.reshape((b, t, c))?, saved)))
    }

    fn backward(&self, saved: Saved, dy: &Tensor, input_grad: bool) -> Result<ExplicitGrads> {
        let [c_fc, mlp_proj] = self
            .affines()
            .expect("forward_saving kept tensors only for affine projections");
        let (b, t, c) = dy.dims3()?;
        let d_out = rows(dy)?;
        let (h, ln_2, up, act, d_down) = match saved.len() {
            5 => {
                let [h, ln_2, up, act, seeds] = unpack(saved, &self.name)?;
                let mode = mode_of(&seeds, &self.name)?;
                let site = Site::MlpOutput;
                let d_down = dropout(d_out.clone(), self.dropout, mode, &self.name, site)?;
                (h, ln_2, up, act, d_down)
            }
            _ => {
                let [h, ln_2, up, act] = unpack(saved, &self.name)?;
                (h, ln_2, up, act, d_out.clone())
            }
        };
        let (d_act, d_w_down, d_b_down) = affine_backward(&act, mlp_proj, &d_down)?;
        let d_up = ops::gelu_tanh_backward(&up, &d_act)?;
        let (d_ln_2, d_w_up, d_b_up) = affine_backward(&ln_2, c_fc, &d_up)?;
        let (w2, b2) = (self.ln_2.weight().detach(), self.ln_2.bias().detach());
        let (d_h, d_w2, d_b2) = ops::layer_norm_backward(&h, &w2, &b2, &d_ln_2, self.ln_2.eps())?;
        let input = match input_grad {
            true => Some(ops::residual_add(&d_h, &d_out)?.reshape((b, t, c))?),
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
