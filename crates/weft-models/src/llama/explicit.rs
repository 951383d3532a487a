//! The Llama blocks' own backward ([`ExplicitBackward`]), as the GPT's: each forward runs
//! graph-free through weft-tensor's fused ops (RMSNorm, the rotary embedding and the attention
//! on the packed q | k | v rows, SwiGLU) and matmuls, keeping the tensors its backward reads;
//! the embeddings keep the ids and sum the table's gradient by id ([`ops::lookup_backward`]:
//! deterministic kernels where Candle runs `index_add`);
//! the backward is written out, each gradient computed once (Candle's autograd adds every
//! intermediate gradient into a zero-filled accumulator first). The separate q, k and v
//! weights are stacked into one product each way; the attention keeps each query row's
//! log-sum-exp, never the weights. Split over a tensor-parallel group, the forward sums the
//! output projections' terms and the backward the normalised input's gradient over the ranks
//! (the lookup's rows too: each rank looks up the ids its block of the table holds).

use candle_core::{DType, Tensor};
use weft_tensor::{ops, ExplicitBackward, ExplicitGrads, Mode, Result, Saved, TensorError};

use super::blocks::{AttentionBlock, Embeddings, GateUp, Head, MlpBlock, Qkv};
use super::norm::RmsNorm;
use super::split::{local_ids, partial_lookup, sum};
use crate::gpt::lookup;

/// `x Wᵀ` over rows for an `nn.Linear` weight `W` `[out, in]`.
fn linear(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    Ok(x.matmul(&weight.t()?)?)
}

/// The gradients of `x Wᵀ` from `dy`: `(dx, dW)`.
fn linear_backward(x: &Tensor, weight: &Tensor, dy: &Tensor) -> Result<(Tensor, Tensor)> {
    Ok((dy.matmul(weight)?, dy.t()?.matmul(x)?))
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

/// The RMSNorm of rows `h`.
fn normed(norm: &RmsNorm, h: &Tensor) -> Result<Tensor> {
    Ok(ops::rms_norm(h, &norm.weight().detach(), norm.eps())?)
}

/// The input's gradient `dx = d(norm)/dh + d_out` (the residual) and the norm's weight's.
fn through_norm(
    norm: &RmsNorm,
    h: &Tensor,
    d_normed: &Tensor,
    d_out: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let (d_h, d_w) = ops::rms_norm_backward(h, &norm.weight().detach(), d_normed, norm.eps())?;
    Ok((ops::residual_add(&d_h, d_out)?, d_w))
}

impl ExplicitBackward for Embeddings {
    fn forward_saving(&self, ids: &Tensor, _mode: Mode) -> Result<Option<(Tensor, Saved)>> {
        if ids.dtype() != DType::U32 {
            return Ok(None);
        }
        let table = self.table.detach();
        let rows = match &self.split {
            None => lookup(&table, ids)?,
            Some(_) => sum(&self.split, partial_lookup(&table, ids, self.start()?)?)?,
        };
        Ok(Some((rows, vec![ids.clone()])))
    }

    fn backward(&self, saved: Saved, dy: &Tensor, _input_grad: bool) -> Result<ExplicitGrads> {
        let [ids] = unpack(saved, "embeddings")?;
        let rows = self.table.dim(0)?;
        let d_table = match &self.split {
            None => ops::lookup_backward(&ids, dy, rows)?,
            Some(_) => {
                // The other ranks' ids land on one row past the block, then dropped.
                let (local, _) = local_ids(&ids, self.start()?, rows, rows as u32, dy.dtype())?;
                ops::lookup_backward(&local, dy, rows + 1)?.narrow(0, 0, rows)?
            }
        };
        Ok(ExplicitGrads {
            input: None,
            params: vec![(self.table.id(), d_table)],
        })
    }
}

impl AttentionBlock {
    /// The packed projection's weight `[(heads + 2 kv_heads) d, C]`: q, k and v stacked.
    fn qkv_weight(&self) -> Result<Tensor> {
        Ok(match &self.qkv {
            Qkv::Separate { q, k, v } => Tensor::cat(&[q.detach(), k.detach(), v.detach()], 0)?,
            Qkv::Fused(w) => w.detach(),
        })
    }
}

impl ExplicitBackward for AttentionBlock {
    fn forward_saving(&self, x: &Tensor, _mode: Mode) -> Result<Option<(Tensor, Saved)>> {
        let (b, t, c) = x.dims3()?;
        self.check_length(t)?;
        let h = rows(x)?;
        let normed = normed(&self.norm, &h)?;
        let qkv = linear(&normed, &self.qkv_weight()?)?.reshape((b, t, ()))?;
        let rotated = ops::rotary_packed(&qkv, self.heads, &self.inverse_frequencies)?;
        let (attended, lse) = ops::packed_causal_attention(&rotated, self.heads)?;
        let attended = attended.reshape((b * t, ()))?;
        let projected = sum(&self.split, linear(&attended, &self.o_proj.detach())?)?;
        let out = ops::residual_add(&h, &projected)?;
        let saved = vec![h, normed, rotated, attended, lse];
        Ok(Some((out.reshape((b, t, c))?, saved)))
    }

    fn backward(&self, saved: Saved, dy: &Tensor, input_grad: bool) -> Result<ExplicitGrads> {
        let [h, normed, rotated, attended, lse] = unpack(saved, &self.name)?;
        let (b, t, c) = dy.dims3()?;
        let d_out = rows(dy)?;
        let (d_attended, d_o) = linear_backward(&attended, &self.o_proj.detach(), &d_out)?;
        let as_sequences = |x: &Tensor| x.reshape((b, t, ()));
        let d_rotated = ops::packed_causal_attention_backward(
            &rotated,
            &as_sequences(&attended)?,
            &lse,
            &as_sequences(&d_attended)?,
            self.heads,
        )?;
        let d_qkv = ops::rotary_packed_backward(&d_rotated, self.heads, &self.inverse_frequencies)?
            .reshape((b * t, ()))?;
        let (d_normed, d_qkv_w) = linear_backward(&normed, &self.qkv_weight()?, &d_qkv)?;
        let d_normed = sum(&self.split, d_normed)?;
        let (d_x, d_norm) = through_norm(&self.norm, &h, &d_normed, &d_out)?;
        let mut params = vec![(self.norm.weight().id(), d_norm)];
        match &self.qkv {
            Qkv::Separate { q, k, v } => {
                let mut start = 0;
                for w in [q, k, v] {
                    let rows = w.dim(0)?;
                    params.push((w.id(), d_qkv_w.narrow(0, start, rows)?));
                    start += rows;
                }
            }
            Qkv::Fused(w) => params.push((w.id(), d_qkv_w)),
        }
        params.push((self.o_proj.id(), d_o));
        let input = input_grad.then(|| d_x.reshape((b, t, c))).transpose()?;
        Ok(ExplicitGrads { input, params })
    }
}

impl ExplicitBackward for MlpBlock {
    fn forward_saving(&self, x: &Tensor, _mode: Mode) -> Result<Option<(Tensor, Saved)>> {
        let (b, t, c) = x.dims3()?;
        let h = rows(x)?;
        let normed = normed(&self.norm, &h)?;
        let (gate, up) = match &self.gate_up {
            GateUp::Separate { gate, up } => (
                linear(&normed, &gate.detach())?,
                linear(&normed, &up.detach())?,
            ),
            GateUp::Fused(w) => {
                let both = linear(&normed, &w.detach())?;
                let inner = both.dim(1)? / 2;
                (
                    both.narrow(1, 0, inner)?.contiguous()?,
                    both.narrow(1, inner, inner)?.contiguous()?,
                )
            }
        };
        let act = ops::swiglu(&gate, &up)?;
        let projected = sum(&self.split, linear(&act, &self.down_proj.detach())?)?;
        let out = ops::residual_add(&h, &projected)?;
        Ok(Some((
            out.reshape((b, t, c))?,
            vec![h, normed, gate, up, act],
        )))
    }

    fn backward(&self, saved: Saved, dy: &Tensor, input_grad: bool) -> Result<ExplicitGrads> {
        let [h, normed, gate, up, act] = unpack(saved, &self.name)?;
        let (b, t, c) = dy.dims3()?;
        let d_out = rows(dy)?;
        let (d_act, d_down) = linear_backward(&act, &self.down_proj.detach(), &d_out)?;
        let (d_gate, d_up) = ops::swiglu_backward(&gate, &up, &d_act)?;
        let mut params = Vec::with_capacity(4);
        let d_normed = match &self.gate_up {
            GateUp::Separate { gate, up } => {
                let (d_from_gate, d_gate_w) = linear_backward(&normed, &gate.detach(), &d_gate)?;
                let (d_from_up, d_up_w) = linear_backward(&normed, &up.detach(), &d_up)?;
                params.push((gate.id(), d_gate_w));
                params.push((up.id(), d_up_w));
                ops::residual_add(&d_from_gate, &d_from_up)?
            }
            GateUp::Fused(w) => {
                let d_both = Tensor::cat(&[&d_gate, &d_up], 1)?;
                let (d_normed, d_w) = linear_backward(&normed, &w.detach(), &d_both)?;
                params.push((w.id(), d_w));
                d_normed
            }
        };
        let d_normed = sum(&self.split, d_normed)?;
        let (d_x, d_norm) = through_norm(&self.norm, &h, &d_normed, &d_out)?;
        params.insert(0, (self.norm.weight().id(), d_norm));
        params.push((self.down_proj.id(), d_down));
        let input = input_grad.then(|| d_x.reshape((b, t, c))).transpose()?;
        Ok(ExplicitGrads { input, params })
    }
}

impl ExplicitBackward for Head {
    fn forward_saving(&self, x: &Tensor, _mode: Mode) -> Result<Option<(Tensor, Saved)>> {
        let (b, t, _) = x.dims3()?;
        let h = rows(x)?;
        let normed = normed(&self.norm, &h)?;
        let logits = ops::project(&normed, &self.lm_head.detach().t()?)?;
        Ok(Some((logits.reshape((b, t, ()))?, vec![h, normed])))
    }

    fn backward(&self, saved: Saved, dy: &Tensor, input_grad: bool) -> Result<ExplicitGrads> {
        let [h, normed] = unpack(saved, "head")?;
        let (b, t, vocab) = dy.dims3()?;
        let d_logits = dy.reshape((b * t, vocab))?.contiguous()?;
        let (d_normed, d_head) = linear_backward(&normed, &self.lm_head.detach(), &d_logits)?;
        let d_normed = sum(&self.split, d_normed)?;
        let (d_h, d_norm) =
            ops::rms_norm_backward(&h, &self.norm.weight().detach(), &d_normed, self.norm.eps())?;
        let input = input_grad.then(|| d_h.reshape((b, t, ()))).transpose()?;
        let params = vec![
            (self.norm.weight().id(), d_norm),
            (self.lm_head.id(), d_head),
        ];
        Ok(ExplicitGrads { input, params })
    }
}
