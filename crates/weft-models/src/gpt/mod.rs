//! A decoder-only transformer with GPT-2's architecture, as a block model: `embeddings`, one
//! block per layer (`h.0`, …), `head`. Parameter names and order follow Hugging Face's
//! `GPT2LMHeadModel.state_dict()` (`transformer.h.0.attn.c_attn.weight`, Conv1D's `[in, out]`
//! layout; the head tied to `transformer.wte.weight`), and so does the initialisation: normal
//! weights of std 0.02 (the residual projections `c_proj` 0.02 / sqrt(2 · layers)), zero
//! biases, LayerNorms at 1 and 0. The embedding table is padded to a multiple of 64 rows with
//! zeros; the padded logits are masked out of the loss ([`crate::loss::NextToken`]).

mod attention;
mod blocks;
mod config;
pub mod hf;
mod parts;

use candle_core::{DType, Device, Tensor};
use weft_tensor::{Block, BlockModel, ParamStore};

pub use attention::causal_self_attention;
pub use blocks::{Embeddings, Head, TransformerBlock};
pub use config::{GptConfig, MODEL_NAMES};
pub use parts::{lookup, Dense, Embedding, GptLayers, Projection, ProjectionRole, TokenEmbedding};

use crate::error::Result;
use crate::layers::{Init, LayerNorm};

/// Builds the GPT of `config` with every part whole.
pub fn gpt(config: &GptConfig, dtype: DType, device: &Device) -> Result<BlockModel> {
    gpt_with_layers(config, dtype, device, &Dense)
}

/// Builds the GPT of `config` with its parts made by `layers` (whole, or a rank's shards).
pub fn gpt_with_layers(
    config: &GptConfig,
    dtype: DType,
    device: &Device,
    layers: &dyn GptLayers,
) -> Result<BlockModel> {
    config.validate()?;
    let (c, std) = (config.n_embd, config.init_std);
    let residual_std = std / (2.0 * config.n_layer as f64).sqrt();
    let mut init = Init::new(config.seed);
    let mut store = ParamStore::new(device, dtype);
    let mut root = store.scope("transformer");
    let mut normal = |shape: &[usize], std: f64| init.normal(shape, std, dtype, device);
    let zeros = |shape: &[usize]| Tensor::zeros(shape, dtype, device);

    let start = root.store_len();
    let table = normal(&[config.vocab_size, c], std)?;
    let padding = zeros(&[config.padded_vocab() - config.vocab_size, c])?;
    let wte = layers.token_embedding(&mut root.sub("wte"), Tensor::cat(&[table, padding], 0)?)?;
    let wpe = root
        .sub("wpe")
        .parameter("weight", normal(&[config.context, c], std)?)?;
    let mut blocks: Vec<Box<dyn Block>> = vec![Box::new(Embeddings {
        wte: wte.clone(),
        wpe,
        dropout: config.dropout,
        entries: start..root.store_len(),
    })];
    for layer in 0..config.n_layer {
        let mut scope = root.sub(&format!("h.{layer}"));
        let start = scope.store_len();
        let ln_1 = LayerNorm::new(&mut scope.sub("ln_1"), c, config.layer_norm_eps)?;
        let mut attn = scope.sub("attn");
        let c_attn = layers.projection(
            &mut attn.sub("c_attn"),
            ProjectionRole::AttentionQkv,
            normal(&[c, 3 * c], std)?,
            zeros(&[3 * c])?,
        )?;
        let attn_proj = layers.projection(
            &mut attn.sub("c_proj"),
            ProjectionRole::AttentionOutput,
            normal(&[c, c], residual_std)?,
            zeros(&[c])?,
        )?;
        let ln_2 = LayerNorm::new(&mut scope.sub("ln_2"), c, config.layer_norm_eps)?;
        let mut mlp = scope.sub("mlp");
        let c_fc = layers.projection(
            &mut mlp.sub("c_fc"),
            ProjectionRole::MlpUp,
            normal(&[c, 4 * c], std)?,
            zeros(&[4 * c])?,
        )?;
        let mlp_proj = layers.projection(
            &mut mlp.sub("c_proj"),
            ProjectionRole::MlpDown,
            normal(&[4 * c, c], residual_std)?,
            zeros(&[c])?,
        )?;
        blocks.push(Box::new(TransformerBlock {
            name: format!("h.{layer}"),
            ln_1,
            c_attn,
            attn_proj,
            ln_2,
            c_fc,
            mlp_proj,
            head_dim: config.head_dim(),
            dropout: config.dropout,
            entries: start..scope.store_len(),
        }));
    }
    let start = root.store_len();
    let ln_f = LayerNorm::new(&mut root.sub("ln_f"), c, config.layer_norm_eps)?;
    blocks.push(Box::new(Head {
        ln_f,
        wte,
        entries: start..root.store_len(),
    }));
    Ok(BlockModel::new(store, blocks)?)
}

#[cfg(test)]
mod tests;
