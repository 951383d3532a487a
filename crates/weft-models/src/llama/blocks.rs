//! The blocks of a Llama-family decoder: the token embeddings, two blocks per layer (its
//! attention half `layers.{i}.attn` and its MLP half `layers.{i}.mlp`, so that a pipeline can
//! cut between them) and the head (the final RMSNorm and the language-model head, the token
//! table itself when tied). Projections are bias-free `nn.Linear`s, weights `[out, in]`. Under
//! a tensor-parallel [`super::split`] each block holds its rank's heads, MLP features and
//! vocabulary rows and sums its part over the ranks where Megatron does.

use std::ops::Range;

use candle_core::{Tensor, Var, D};
use weft_tensor::ops::{self, project, PackedHeads};
use weft_tensor::{Block, EntryId, ExplicitBackward, Mode, Result, TensorError};

use super::norm::RmsNorm;
use super::split::{enter, partial_lookup, reduce, vocab_start, Split};
use crate::gpt::lookup;

/// `x Wᵀ` for an `nn.Linear` weight `W` `[out, in]`.
pub(super) fn linear(x: &Tensor, weight: &Var) -> Result<Tensor> {
    project(x, &weight.as_tensor().t()?)
}

/// The token table looked up: `[B, T]` ids to `[B, T, width]` (split: this rank's rows of
/// the table looked up, zeros for the other ranks' ids, summed over the ranks).
pub struct Embeddings {
    pub(super) table: Var,
    pub(super) entries: Range<EntryId>,
    pub(super) split: Split,
}

impl Embeddings {
    /// The first id this rank's table holds (0 for a whole table).
    pub(super) fn start(&self) -> Result<usize> {
        Ok(match &self.split {
            Some(split) => vocab_start(split.as_ref(), self.table.dim(0)?),
            None => 0,
        })
    }
}

impl Block for Embeddings {
    fn name(&self) -> &str {
        "embeddings"
    }

    fn explicit(&self) -> Option<&dyn ExplicitBackward> {
        Some(self)
    }

    fn forward(&self, ids: &Tensor, _mode: Mode) -> Result<Tensor> {
        match &self.split {
            None => lookup(self.table.as_tensor(), ids),
            Some(_) => {
                let partial = partial_lookup(self.table.as_tensor(), ids, self.start()?)?;
                reduce(&self.split, partial)
            }
        }
    }

    fn entries(&self) -> Range<EntryId> {
        self.entries.clone()
    }
}

/// The attention's projections: separate (Llama) or one fused `qkv_proj` (Phi-3), rows of
/// queries, then keys, then values.
pub(super) enum Qkv {
    Separate { q: Var, k: Var, v: Var },
    Fused(Var),
}

/// The attention half of a layer: `x + o_proj(attention(input_layernorm(x)))`, the queries,
/// keys and values projected as one packed row (the separate weights stacked), the rotary
/// embeddings applied to it and the fused attention run on it ([`ops::rotary_packed`],
/// [`ops::packed_attention`]; [`super::attention::grouped_attention`] is the naive form).
pub struct AttentionBlock {
    pub(super) name: String,
    pub(super) norm: RmsNorm,
    pub(super) qkv: Qkv,
    pub(super) o_proj: Var,
    pub(super) heads: PackedHeads,
    /// The rotary inverse frequencies, `[head_dim / 2]` f32 on the model's device.
    pub(super) inverse_frequencies: Tensor,
    pub(super) max_positions: usize,
    pub(super) entries: Range<EntryId>,
    pub(super) split: Split,
}

impl Block for AttentionBlock {
    fn name(&self) -> &str {
        &self.name
    }

    fn explicit(&self) -> Option<&dyn ExplicitBackward> {
        Some(self)
    }

    fn forward(&self, x: &Tensor, _mode: Mode) -> Result<Tensor> {
        let (b, t, c) = x.dims3()?;
        self.check_length(t)?;
        let h = enter(&self.split, self.norm.forward(&x.reshape((b * t, c))?)?)?;
        let qkv = match &self.qkv {
            Qkv::Separate { q, k, v } => {
                let stacked = Tensor::cat(&[q.as_tensor(), k.as_tensor(), v.as_tensor()], 0)?;
                project(&h, &stacked.t()?)?
            }
            Qkv::Fused(w) => linear(&h, w)?,
        };
        let qkv = qkv.reshape((b, t, self.heads.row_width()))?;
        let qkv = ops::rotary_packed(&qkv, self.heads, &self.inverse_frequencies)?;
        let attended = ops::packed_attention(&qkv, self.heads)?;
        let rows = attended.reshape((b * t, self.heads.out_width()))?;
        let out = reduce(&self.split, linear(&rows, &self.o_proj)?)?;
        Ok((x + out.reshape((b, t, c))?)?)
    }

    fn entries(&self) -> Range<EntryId> {
        self.entries.clone()
    }
}

impl AttentionBlock {
    /// Refuses sequences longer than the rotary tables' `max_position_embeddings`.
    pub(super) fn check_length(&self, t: usize) -> Result<()> {
        if t > self.max_positions {
            return Err(TensorError::Block {
                block: self.name.clone(),
                message: format!(
                    "{t} tokens exceed max_position_embeddings {}",
                    self.max_positions
                ),
            });
        }
        Ok(())
    }
}

/// The MLP's gate and up projections: separate (Llama) or one fused `gate_up_proj` (Phi-3),
/// the gate's rows first.
pub(super) enum GateUp {
    Separate { gate: Var, up: Var },
    Fused(Var),
}

/// The MLP half of a layer: `x + down_proj(silu(gate_proj(h)) · up_proj(h))`, h the
/// post-attention RMSNorm of x.
pub struct MlpBlock {
    pub(super) name: String,
    pub(super) norm: RmsNorm,
    pub(super) gate_up: GateUp,
    pub(super) down_proj: Var,
    pub(super) entries: Range<EntryId>,
    pub(super) split: Split,
}

impl Block for MlpBlock {
    fn name(&self) -> &str {
        &self.name
    }

    fn explicit(&self) -> Option<&dyn ExplicitBackward> {
        Some(self)
    }

    fn forward(&self, x: &Tensor, _mode: Mode) -> Result<Tensor> {
        let (b, t, c) = x.dims3()?;
        let h = enter(&self.split, self.norm.forward(&x.reshape((b * t, c))?)?)?;
        let (gate, up) = match &self.gate_up {
            GateUp::Separate { gate, up } => (linear(&h, gate)?, linear(&h, up)?),
            GateUp::Fused(w) => {
                let both = linear(&h, w)?;
                let inner = both.dim(D::Minus1)? / 2;
                (both.narrow(1, 0, inner)?, both.narrow(1, inner, inner)?)
            }
        };
        let down = reduce(
            &self.split,
            linear(&ops::swiglu(&gate, &up)?, &self.down_proj)?,
        )?;
        Ok((x + down.reshape((b, t, c))?)?)
    }

    fn entries(&self) -> Range<EntryId> {
        self.entries.clone()
    }
}

/// The final RMSNorm and the language-model head: `lm_head`, or the token table when the
/// weights are tied (then owned by the embeddings block of the same model). Split, the logits
/// are this rank's block of the vocabulary, which a vocabulary-parallel loss consumes.
pub struct Head {
    pub(super) norm: RmsNorm,
    pub(super) lm_head: Var,
    /// The table's entry when the head reuses it.
    pub(super) tied: Option<EntryId>,
    pub(super) entries: Range<EntryId>,
    pub(super) split: Split,
}

impl Block for Head {
    fn name(&self) -> &str {
        "head"
    }

    fn explicit(&self) -> Option<&dyn ExplicitBackward> {
        Some(self)
    }

    fn forward(&self, h: &Tensor, _mode: Mode) -> Result<Tensor> {
        linear(&enter(&self.split, self.norm.forward(h)?)?, &self.lm_head)
    }

    fn entries(&self) -> Range<EntryId> {
        self.entries.clone()
    }

    fn shared_parameters(&self) -> Vec<EntryId> {
        self.tied.into_iter().collect()
    }
}
