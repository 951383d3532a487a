//! The blocks of a Llama-family decoder: the token embeddings, two blocks per layer (its
//! attention half `layers.{i}.attn` and its MLP half `layers.{i}.mlp`, so that a pipeline can
//! cut between them) and the head (the final RMSNorm and the language-model head, the token
//! table itself when tied). Projections are bias-free `nn.Linear`s, weights `[out, in]`.

use std::ops::Range;

use candle_core::{Tensor, Var, D};
use weft_tensor::ops::project;
use weft_tensor::{Block, EntryId, Mode, Result, TensorError};

use super::attention::{grouped_attention, rotary_tables};
use super::norm::RmsNorm;
use crate::gpt::lookup;

/// `x Wᵀ` for an `nn.Linear` weight `W` `[out, in]`.
pub(super) fn linear(x: &Tensor, weight: &Var) -> Result<Tensor> {
    project(x, &weight.as_tensor().t()?)
}

/// The token table looked up: `[B, T]` ids to `[B, T, width]`.
pub struct Embeddings {
    pub(super) table: Var,
    pub(super) entries: Range<EntryId>,
}

impl Block for Embeddings {
    fn name(&self) -> &str {
        "embeddings"
    }

    fn forward(&self, ids: &Tensor, _mode: Mode) -> Result<Tensor> {
        lookup(self.table.as_tensor(), ids)
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

/// The attention half of a layer: `x + o_proj(attention(input_layernorm(x)))`.
pub struct AttentionBlock {
    pub(super) name: String,
    pub(super) norm: RmsNorm,
    pub(super) qkv: Qkv,
    pub(super) o_proj: Var,
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) head_dim: usize,
    pub(super) inverse_frequencies: Vec<f64>,
    pub(super) max_positions: usize,
    pub(super) entries: Range<EntryId>,
}

impl Block for AttentionBlock {
    fn name(&self) -> &str {
        &self.name
    }

    fn forward(&self, x: &Tensor, _mode: Mode) -> Result<Tensor> {
        let (b, t, c) = x.dims3()?;
        if t > self.max_positions {
            return Err(TensorError::Block {
                block: self.name.clone(),
                message: format!(
                    "{t} tokens exceed max_position_embeddings {}",
                    self.max_positions
                ),
            });
        }
        let h = self.norm.forward(&x.reshape((b * t, c))?)?;
        let (q_width, kv_width) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let (q, k, v) = match &self.qkv {
            Qkv::Separate { q, k, v } => (linear(&h, q)?, linear(&h, k)?, linear(&h, v)?),
            Qkv::Fused(w) => {
                let all = linear(&h, w)?;
                (
                    all.narrow(1, 0, q_width)?,
                    all.narrow(1, q_width, kv_width)?,
                    all.narrow(1, q_width + kv_width, kv_width)?,
                )
            }
        };
        let heads = |x: Tensor, n: usize| -> Result<Tensor> {
            Ok(x.reshape((b, t, n, self.head_dim))?.transpose(1, 2)?)
        };
        let (cos, sin) = rotary_tables(&self.inverse_frequencies, t, &h)?;
        let attended = grouped_attention(
            &heads(q, self.heads)?,
            &heads(k, self.kv_heads)?,
            &heads(v, self.kv_heads)?,
            (&cos, &sin),
        )?;
        let rows = attended.transpose(1, 2)?.reshape((b * t, q_width))?;
        let out = linear(&rows, &self.o_proj)?.reshape((b, t, c))?;
        Ok((x + out)?)
    }

    fn entries(&self) -> Range<EntryId> {
        self.entries.clone()
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
}

impl Block for MlpBlock {
    fn name(&self) -> &str {
        &self.name
    }

    fn forward(&self, x: &Tensor, _mode: Mode) -> Result<Tensor> {
        let (b, t, c) = x.dims3()?;
        let h = self.norm.forward(&x.reshape((b * t, c))?)?;
        let (gate, up) = match &self.gate_up {
            GateUp::Separate { gate, up } => (linear(&h, gate)?, linear(&h, up)?),
            GateUp::Fused(w) => {
                let both = linear(&h, w)?;
                let inner = both.dim(D::Minus1)? / 2;
                (both.narrow(1, 0, inner)?, both.narrow(1, inner, inner)?)
            }
        };
        let down = linear(&(gate.silu()? * up)?, &self.down_proj)?;
        Ok((x + down.reshape((b, t, c))?)?)
    }

    fn entries(&self) -> Range<EntryId> {
        self.entries.clone()
    }
}

/// The final RMSNorm and the language-model head: `lm_head`, or the token table when the
/// weights are tied (then owned by the embeddings block of the same model).
pub struct Head {
    pub(super) norm: RmsNorm,
    pub(super) lm_head: Var,
    /// The table's entry when the head reuses it.
    pub(super) tied: Option<EntryId>,
    pub(super) entries: Range<EntryId>,
}

impl Block for Head {
    fn name(&self) -> &str {
        "head"
    }

    fn forward(&self, h: &Tensor, _mode: Mode) -> Result<Tensor> {
        linear(&self.norm.forward(h)?, &self.lm_head)
    }

    fn entries(&self) -> Range<EntryId> {
        self.entries.clone()
    }

    fn shared_parameters(&self) -> Vec<EntryId> {
        self.tied.into_iter().collect()
    }
}
