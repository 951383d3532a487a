//! The blocks of a GPT: the embeddings, two blocks per transformer layer (its attention half
//! `h.0.attn` and its MLP half `h.0.mlp`, …) and the head (final LayerNorm and the tied
//! language-model head). Half layers let a pipeline cut between a layer's attention and its
//! MLP, to balance its stages more finely than whole layers allow.

use std::ops::Range;
use std::sync::Arc;

use candle_core::{Tensor, Var};
use weft_tensor::ops::dropout::{Dropout, Placement};
use weft_tensor::{ops, Block, EntryId, ExplicitBackward, Mode, Result, TensorError};

use super::attention::causal_self_attention;
use super::dropout::{dropout, site_dropout, Site};
use super::parts::{Projection, TokenEmbedding};
use crate::layers::LayerNorm;

/// `x + f(x)` on the tokens as rows (`[B·T, width]`): one reshape in and one out, none around
/// each projection and LayerNorm inside `f` (each costs a pass over the tensor in backward).
fn residual_on_rows(x: &Tensor, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let (b, t, c) = x.dims3()?;
    let h = x.reshape((b * t, c))?;
    let out = (&h + f(&h)?)?;
    Ok(out.reshape((b, t, c))?)
}

/// Token plus learned position embeddings: `[B, T]` ids to `[B, T, width]`.
pub struct Embeddings {
    pub(super) wte: Arc<dyn TokenEmbedding>,
    pub(super) wpe: Var,
    pub(super) dropout: f64,
    pub(super) entries: Range<EntryId>,
}

impl Embeddings {
    /// The position embeddings of sequences of `t` tokens (`[t, width]`), or an error naming
    /// the context when they are longer.
    pub(super) fn positions(&self, t: usize) -> Result<Tensor> {
        let context = self.wpe.dim(0)?;
        if t > context {
            return Err(TensorError::Block {
                block: self.name().into(),
                message: format!("{t} tokens exceed the context of {context}"),
            });
        }
        Ok(self.wpe.as_tensor().narrow(0, 0, t)?)
    }
}

impl Block for Embeddings {
    fn name(&self) -> &str {
        "embeddings"
    }

    fn explicit(&self) -> Option<&dyn ExplicitBackward> {
        Some(self)
    }

    fn forward(&self, ids: &Tensor, mode: Mode) -> Result<Tensor> {
        let (_, t) = ids.dims2()?;
        let h = self.wte.forward(ids)?.broadcast_add(&self.positions(t)?)?;
        dropout(h, self.dropout, mode, self.name(), Site::Embeddings)
    }

    fn entries(&self) -> Range<EntryId> {
        self.entries.clone()
    }
}

/// The attention half of a pre-LayerNorm transformer layer: `h + attn(ln_1(h))`.
pub struct AttentionBlock {
    pub(super) name: String,
    pub(super) ln_1: LayerNorm,
    pub(super) c_attn: Box<dyn Projection>,
    pub(super) attn_proj: Box<dyn Projection>,
    pub(super) head_dim: usize,
    /// The model's heads, and the first of them this block's projections hold (all of them
    /// from 0 unless tensor parallelism split them): where its attention weights sit among
    /// the whole model's, for their dropout masks.
    pub(super) heads: usize,
    pub(super) first_head: usize,
    pub(super) dropout: f64,
    pub(super) entries: Range<EntryId>,
}

impl AttentionBlock {
    /// The dropout of the attention weights while training (`None` without), placed among the
    /// whole model's heads.
    pub(super) fn weights_dropout(&self, mode: Mode) -> Option<Dropout> {
        let p = if mode.train { self.dropout } else { 0.0 };
        let placement = Placement {
            axis: 1,
            offset: self.first_head,
            total: self.heads,
        };
        let site = (self.name.as_str(), Site::AttentionWeights);
        (p > 0.0).then(|| site_dropout(p, mode, site, Some(placement)))
    }
}

impl Block for AttentionBlock {
    fn name(&self) -> &str {
        &self.name
    }

    fn explicit(&self) -> Option<&dyn ExplicitBackward> {
        Some(self)
    }

    fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let p = if mode.train { self.dropout } else { 0.0 };
        residual_on_rows(x, |h| {
            let qkv = self.c_attn.forward(&self.ln_1.forward(h)?)?;
            let weights_dropout = self.weights_dropout(mode);
            let attended = causal_self_attention(
                &qkv.reshape((b, t, ()))?,
                self.head_dim,
                weights_dropout.as_ref(),
            )?;
            let attended = attended.reshape((b * t, ()))?;
            let projected = self.attn_proj.forward(&attended)?;
            dropout(projected, p, mode, &self.name, Site::AttentionOutput)
        })
    }

    fn entries(&self) -> Range<EntryId> {
        self.entries.clone()
    }
}

/// The MLP half of a pre-LayerNorm transformer layer: `h + mlp(ln_2(h))`, a GELU (tanh) MLP
/// of 4× width.
pub struct MlpBlock {
    pub(super) name: String,
    pub(super) ln_2: LayerNorm,
    pub(super) c_fc: Box<dyn Projection>,
    pub(super) mlp_proj: Box<dyn Projection>,
    pub(super) dropout: f64,
    pub(super) entries: Range<EntryId>,
}

impl Block for MlpBlock {
    fn name(&self) -> &str {
        &self.name
    }

    fn explicit(&self) -> Option<&dyn ExplicitBackward> {
        Some(self)
    }

    fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let p = if mode.train { self.dropout } else { 0.0 };
        residual_on_rows(x, |h| {
            let up = ops::gelu_tanh(&self.c_fc.forward(&self.ln_2.forward(h)?)?)?;
            let down = self.mlp_proj.forward(&up)?;
            dropout(down, p, mode, &self.name, Site::MlpOutput)
        })
    }

    fn entries(&self) -> Range<EntryId> {
        self.entries.clone()
    }
}

/// The final LayerNorm and the language-model head, the token embedding transposed.
pub struct Head {
    pub(super) ln_f: LayerNorm,
    pub(super) wte: Arc<dyn TokenEmbedding>,
    /// Whether the table belongs to the embeddings block of the same model (tied weights);
    /// otherwise this block owns its copy (a pipeline's last stage).
    pub(super) shared: bool,
    pub(super) entries: Range<EntryId>,
}

impl Block for Head {
    fn name(&self) -> &str {
        "head"
    }

    fn explicit(&self) -> Option<&dyn ExplicitBackward> {
        Some(self)
    }

    fn forward(&self, h: &Tensor, _mode: Mode) -> Result<Tensor> {
        self.wte.logits(&self.ln_f.forward(h)?)
    }

    fn entries(&self) -> Range<EntryId> {
        self.entries.clone()
    }

    fn shared_parameters(&self) -> Vec<EntryId> {
        match self.shared {
            true => vec![self.wte.table_id()],
            false => Vec::new(),
        }
    }
}
