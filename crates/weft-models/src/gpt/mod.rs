//! A decoder-only transformer with GPT-2's architecture, as a block model: `embeddings`, two
//! blocks per layer (`h.0.attn`, `h.0.mlp`, …), `head`. Parameter names and order follow Hugging Face's
//! `GPT2LMHeadModel.state_dict()` (`transformer.h.0.attn.c_attn.weight`, Conv1D's `[in, out]`
//! layout; the head tied to `transformer.wte.weight`), and so does the initialisation: normal
//! weights of std 0.02 (the residual projections `c_proj` 0.02 / sqrt(2 · layers)), zero
//! biases, LayerNorms at 1 and 0. The embedding table is padded to a multiple of 64 rows with
//! zeros; the padded logits are masked out of the loss ([`crate::loss::NextToken`]).

mod attention;
mod blocks;
mod config;
mod dropout;
mod explicit;
mod explicit_embeddings;
mod explicit_head;
pub mod hf;
mod layer;
mod parts;

use std::ops::Range;

use candle_core::{DType, Device, Tensor};
use weft_tensor::{Block, BlockModel, ParamStore};

pub use attention::causal_self_attention;
pub use blocks::{AttentionBlock, Embeddings, Head, MlpBlock};
pub use config::{GptConfig, MODEL_NAMES};
pub use parts::{
    lookup, Affine, AffineSplit, Dense, Embedding, GptLayers, HeadProjection, PartSum, Projection,
    ProjectionRole, TokenEmbedding,
};

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
    gpt_stage(config, dtype, device, layers, 0..config.num_blocks())
}

/// Builds blocks `blocks` of the GPT of `config` (block 0 is `embeddings`, `2l + 1` and `2l + 2`
/// layer `l`'s attention and MLP halves `h.{l}.attn` and `h.{l}.mlp`, `2 n_layer + 1` the
/// `head`): a pipeline stage. Its parameters keep the whole
/// model's names and the values the whole model built from the same seed has (the other
/// blocks' values are drawn and dropped, one tensor at a time). A stage with the head but not
/// the embeddings keeps its own copy of the token table, `transformer.wte.weight`, owned by
/// the head (Megatron's arrangement: the copies stay equal because their gradients are summed
/// across the first and last stage before each update).
pub fn gpt_stage(
    config: &GptConfig,
    dtype: DType,
    device: &Device,
    layers: &dyn GptLayers,
    blocks: Range<usize>,
) -> Result<BlockModel> {
    config.validate()?;
    let total = config.num_blocks();
    crate::stages::check_blocks(&config.name, &blocks, total)?;
    let keep = |block: usize| blocks.contains(&block);
    let (c, std) = (config.n_embd, config.init_std);
    let residual_std = std / (2.0 * config.n_layer as f64).sqrt();
    let mut init = Init::new(config.seed);
    let mut store = ParamStore::new(device, dtype);
    let mut root = store.scope("transformer");
    let mut normal = |shape: &[usize], std: f64| init.normal(shape, std, dtype, device);
    let zeros = |shape: &[usize]| Tensor::zeros(shape, dtype, device);
    let padded_table = |table: Tensor| -> Result<Tensor> {
        let padding = zeros(&[config.padded_vocab() - config.vocab_size, c])?;
        Ok(Tensor::cat(&[table, padding], 0)?)
    };

    let mut parts: Vec<Box<dyn Block>> = Vec::new();
    let start = root.store_len();
    let table = normal(&[config.vocab_size, c], std)?;
    let wpe = normal(&[config.context, c], std)?;
    let mut wte = None;
    if keep(0) {
        let table = padded_table(table.clone())?;
        let embedding = layers.token_embedding(&mut root.sub("wte"), table)?;
        let wpe = root.sub("wpe").parameter("weight", wpe)?;
        parts.push(Box::new(Embeddings {
            wte: embedding.clone(),
            wpe,
            dropout: config.dropout,
            entries: start..root.store_len(),
        }));
        wte = Some(embedding);
    }
    for layer in 0..config.n_layer {
        // Every layer's values are drawn, kept or not, so that a stage's equal the whole's.
        let attention = [normal(&[c, 3 * c], std)?, normal(&[c, c], residual_std)?];
        let mlp = [
            normal(&[c, 4 * c], std)?,
            normal(&[4 * c, c], residual_std)?,
        ];
        if keep(2 * layer + 1) {
            let half = layer::attention_half(config, &mut root, layers, layer, attention)?;
            parts.push(Box::new(half));
        }
        if keep(2 * layer + 2) {
            parts.push(Box::new(layer::mlp_half(
                config, &mut root, layers, layer, mlp,
            )?));
        }
    }
    if keep(total - 1) {
        let start = root.store_len();
        let (wte, shared) = match wte {
            Some(wte) => (wte, true),
            None => (
                layers.token_embedding(&mut root.sub("wte"), padded_table(table)?)?,
                false,
            ),
        };
        let ln_f = LayerNorm::new(&mut root.sub("ln_f"), c, config.layer_norm_eps)?;
        parts.push(Box::new(Head {
            ln_f,
            wte,
            shared,
            entries: start..root.store_len(),
        }));
    }
    Ok(BlockModel::new(store, parts)?)
}

#[cfg(test)]
mod tests;
