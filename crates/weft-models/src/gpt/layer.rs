//! Building a transformer layer's two blocks, each registering its own parameters under the
//! layer's Hugging Face names (`h.{l}.ln_1`, `h.{l}.attn.*`; `h.{l}.ln_2`, `h.{l}.mlp.*`), so a
//! pipeline stage that keeps one half holds that half's parameters only.

use candle_core::Tensor;
use weft_tensor::Scope;

use super::blocks::{AttentionBlock, MlpBlock};
use super::config::GptConfig;
use super::parts::{GptLayers, ProjectionRole};
use crate::error::Result;
use crate::layers::LayerNorm;

/// `h.{layer}.attn`: `ln_1` and the attention's projections made by `layers` from their
/// initial weights `[c_attn, c_proj]` (zero biases).
pub(super) fn attention_half(
    config: &GptConfig,
    root: &mut Scope,
    layers: &dyn GptLayers,
    layer: usize,
    [c_attn, c_proj]: [Tensor; 2],
) -> Result<AttentionBlock> {
    let c = config.n_embd;
    let (dtype, device) = (c_attn.dtype(), c_attn.device().clone());
    let zeros = |n: usize| Tensor::zeros(n, dtype, &device);
    let mut scope = root.sub(&format!("h.{layer}"));
    let start = scope.store_len();
    let ln_1 = LayerNorm::new(&mut scope.sub("ln_1"), c, config.layer_norm_eps)?;
    let mut attn = scope.sub("attn");
    let bias = zeros(3 * c)?;
    let qkv = ProjectionRole::AttentionQkv;
    let c_attn = layers.projection(&mut attn.sub("c_attn"), qkv, c_attn, bias)?;
    let output = ProjectionRole::AttentionOutput;
    let attn_proj = layers.projection(&mut attn.sub("c_proj"), output, c_proj, zeros(c)?)?;
    Ok(AttentionBlock {
        name: format!("h.{layer}.attn"),
        ln_1,
        c_attn,
        attn_proj,
        head_dim: config.head_dim(),
        heads: config.n_head,
        first_head: layers.first_head(config.n_head),
        dropout: config.dropout,
        entries: start..scope.store_len(),
    })
}

/// `h.{layer}.mlp`: `ln_2` and the MLP's projections made by `layers` from their initial
/// weights `[c_fc, c_proj]` (zero biases).
pub(super) fn mlp_half(
    config: &GptConfig,
    root: &mut Scope,
    layers: &dyn GptLayers,
    layer: usize,
    [c_fc, c_proj]: [Tensor; 2],
) -> Result<MlpBlock> {
    let c = config.n_embd;
    let (dtype, device) = (c_fc.dtype(), c_fc.device().clone());
    let zeros = |n: usize| Tensor::zeros(n, dtype, &device);
    let mut scope = root.sub(&format!("h.{layer}"));
    let start = scope.store_len();
    let ln_2 = LayerNorm::new(&mut scope.sub("ln_2"), c, config.layer_norm_eps)?;
    let mut mlp = scope.sub("mlp");
    let up = ProjectionRole::MlpUp;
    let c_fc = layers.projection(&mut mlp.sub("c_fc"), up, c_fc, zeros(4 * c)?)?;
    let down = ProjectionRole::MlpDown;
    let mlp_proj = layers.projection(&mut mlp.sub("c_proj"), down, c_proj, zeros(c)?)?;
    Ok(MlpBlock {
        name: format!("h.{layer}.mlp"),
        ln_2,
        c_fc,
        mlp_proj,
        dropout: config.dropout,
        entries: start..scope.store_len(),
    })
}
