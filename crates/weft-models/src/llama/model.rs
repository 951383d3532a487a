//! Builds a Llama-family decoder as a block model with Hugging Face's parameter names
//! (`model.embed_tokens.weight`, `model.layers.0.self_attn.q_proj.weight`, …, `model.norm.weight`,
//! `lm_head.weight` unless tied; Phi-3's fused `qkv_proj` and `gate_up_proj`) and its
//! initialisation (every projection and the table normal with std `initializer_range`, the
//! RMSNorms at one). The values are drawn in one order for every architecture: a Phi-3 model's
//! fused projections hold exactly the separate projections a Llama model of the same shape and
//! seed holds. A split model ([`LlamaSplit`]) keeps its rank's parts of the same values.

use std::ops::Range;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var};
use weft_tensor::ops::PackedHeads;
use weft_tensor::{Block, BlockModel, Scope};

use super::blocks::{AttentionBlock, Embeddings, GateUp, Head, MlpBlock, Qkv};
use super::config::{Architecture, LlamaConfig};
use super::norm::RmsNorm;
use super::rope::inverse_frequencies;
use super::split::{parameter, Cut, LlamaSplit, Split};
use crate::error::{ModelError, Result};
use crate::layers::Init;

/// Builds the model `config` describes, in `dtype` on `device`.
pub fn llama(config: &LlamaConfig, dtype: DType, device: &Device) -> Result<BlockModel> {
    llama_stage(config, dtype, device, 0..config.num_blocks(), None)
}

/// The model `config` describes as this rank's parts under `split` (attention by heads, the
/// MLP by features, the table and head by vocabulary rows; RMSNorms whole).
pub fn llama_split(
    config: &LlamaConfig,
    dtype: DType,
    device: &Device,
    split: Arc<dyn LlamaSplit>,
) -> Result<BlockModel> {
    llama_stage(config, dtype, device, 0..config.num_blocks(), Some(split))
}

/// Refuses a split whose ranks do not divide the heads, key/value heads, MLP features or
/// vocabulary of `config`.
fn check_split(config: &LlamaConfig, split: &Split) -> Result<usize> {
    let Some(split) = split else {
        return Ok(1);
    };
    let size = split.size();
    for (what, count) in [
        ("attention heads", config.num_attention_heads),
        ("key/value heads", config.num_key_value_heads),
        ("MLP features", config.intermediate_size),
        ("vocabulary rows", config.vocab_size),
    ] {
        if size == 0 || !count.is_multiple_of(size) {
            return Err(ModelError::Config(format!(
                "{}: {size} tensor-parallel ranks do not divide its {count} {what}",
                config.name
            )));
        }
    }
    Ok(size)
}

/// The blocks `blocks` of the model (a pipeline stage's: 0 the embeddings, 2i + 1 and 2i + 2
/// layer i's halves, the last the head), with the whole model's names and the values the
/// whole model built from the same seed has (the other blocks' values are drawn and dropped,
/// one tensor at a time). A stage with a tied head but not the embeddings keeps its own copy of
/// the token table, `model.embed_tokens.weight`, owned by the head (as the GPT's stages: the
/// copies stay equal because their gradients are summed across the first and last stage).
/// With `split`, each weight is this rank's part of it.
pub fn llama_stage(
    config: &LlamaConfig,
    dtype: DType,
    device: &Device,
    blocks: Range<usize>,
    split: Split,
) -> Result<BlockModel> {
    config.validate()?;
    let ranks = check_split(config, &split)?;
    let total = config.num_blocks();
    crate::stages::check_blocks(&config.name, &blocks, total)?;
    let keep = |block: usize| blocks.contains(&block);
    let (c, d) = (config.hidden_size, config.head_dim);
    let (q_rows, kv_rows) = (
        config.num_attention_heads * d,
        config.num_key_value_heads * d,
    );
    let inner = config.intermediate_size;
    let mut init = Init::new(config.seed);
    let mut normal = |shape: &[usize]| init.normal(shape, config.init_std, dtype, device);
    let fused = config.architecture == Architecture::Phi3;
    let inverse = inverse_frequencies(d, config.rope_theta, config.rope_scaling.as_ref());
    let inverse: Vec<f32> = inverse.iter().map(|&f| f as f32).collect();
    let inverse = Tensor::from_vec(inverse, d / 2, device)?;
    // This rank's heads (all of them, whole).
    let heads = PackedHeads {
        heads: config.num_attention_heads / ranks,
        kv_heads: config.num_key_value_heads / ranks,
        head_dim: d,
    };
    let vocab = [config.vocab_size];
    let weight = |scope: &mut Scope, name: &str, value: Tensor, cut: Cut| -> Result<Var> {
        Ok(parameter(
            &split,
            &mut scope.sub(name),
            "weight",
            value,
            cut,
        )?)
    };

    let mut store = weft_tensor::ParamStore::new(device, dtype);
    let mut parts: Vec<Box<dyn Block>> = Vec::new();
    let table_values = normal(&[config.vocab_size, c])?;
    let mut root = store.scope("model");
    let mut table = None;
    if keep(0) {
        let start = root.store_len();
        let var = weight(
            &mut root,
            "embed_tokens",
            table_values.clone(),
            Cut::Rows(&vocab),
        )?;
        parts.push(Box::new(Embeddings {
            table: var.clone(),
            entries: start..root.store_len(),
            split: split.clone(),
        }));
        table = Some((var, start));
    }
    for i in 0..config.num_hidden_layers {
        let [q, k, v, o] = [
            normal(&[q_rows, c])?,
            normal(&[kv_rows, c])?,
            normal(&[kv_rows, c])?,
            normal(&[c, q_rows])?,
        ];
        let [gate, up, down] = [
            normal(&[inner, c])?,
            normal(&[inner, c])?,
            normal(&[c, inner])?,
        ];
        let mut layer = root.sub(&format!("layers.{i}"));
        if keep(2 * i + 1) {
            let start = layer.store_len();
            let norm = RmsNorm::new(&mut layer.sub("input_layernorm"), c, config.rms_norm_eps)?;
            let mut attn = layer.sub("self_attn");
            let qkv = match fused {
                true => {
                    let packed = Tensor::cat(&[q, k, v], 0)?;
                    let groups = Cut::Rows(&[q_rows, kv_rows, kv_rows]);
                    Qkv::Fused(weight(&mut attn, "qkv_proj", packed, groups)?)
                }
                false => Qkv::Separate {
                    q: weight(&mut attn, "q_proj", q, Cut::Rows(&[q_rows]))?,
                    k: weight(&mut attn, "k_proj", k, Cut::Rows(&[kv_rows]))?,
                    v: weight(&mut attn, "v_proj", v, Cut::Rows(&[kv_rows]))?,
                },
            };
            let o_proj = weight(&mut attn, "o_proj", o, Cut::Columns)?;
            parts.push(Box::new(AttentionBlock {
                name: format!("layers.{i}.attn"),
                norm,
                qkv,
                o_proj,
                heads,
                inverse_frequencies: inverse.clone(),
                max_positions: config.max_position_embeddings,
                entries: start..layer.store_len(),
                split: split.clone(),
            }));
        }
        if keep(2 * i + 2) {
            let start = layer.store_len();
            let norm = RmsNorm::new(
                &mut layer.sub("post_attention_layernorm"),
                c,
                config.rms_norm_eps,
            )?;
            let mut mlp = layer.sub("mlp");
            let gate_up = match fused {
                true => {
                    let packed = Tensor::cat(&[gate, up], 0)?;
                    let groups = Cut::Rows(&[inner, inner]);
                    GateUp::Fused(weight(&mut mlp, "gate_up_proj", packed, groups)?)
                }
                false => GateUp::Separate {
                    gate: weight(&mut mlp, "gate_proj", gate, Cut::Rows(&[inner]))?,
                    up: weight(&mut mlp, "up_proj", up, Cut::Rows(&[inner]))?,
                },
            };
            let down_proj = weight(&mut mlp, "down_proj", down, Cut::Columns)?;
            parts.push(Box::new(MlpBlock {
                name: format!("layers.{i}.mlp"),
                norm,
                gate_up,
                down_proj,
                entries: start..layer.store_len(),
                split: split.clone(),
            }));
        }
    }
    if keep(total - 1) {
        let start = root.store_len();
        // A tied head without the embeddings on its stage owns a copy of the table.
        let copy = match (config.tie_word_embeddings, &table) {
            (true, None) => Some(weight(
                &mut root,
                "embed_tokens",
                table_values,
                Cut::Rows(&vocab),
            )?),
            _ => None,
        };
        let norm = RmsNorm::new(&mut root.sub("norm"), c, config.rms_norm_eps)?;
        drop(root);
        let (lm_head, tied) = match (config.tie_word_embeddings, table, copy) {
            (true, Some((table, id)), _) => (table, Some(id)),
            (true, None, Some(copy)) => (copy, None),
            _ => {
                let values = normal(&[config.vocab_size, c])?;
                let mut scope = store.scope("lm_head");
                let head = parameter(&split, &mut scope, "weight", values, Cut::Rows(&vocab))?;
                (head, None)
            }
        };
        parts.push(Box::new(Head {
            norm,
            lm_head,
            tied,
            entries: start..store.len(),
            split,
        }));
    }
    Ok(BlockModel::new(store, parts)?)
}
