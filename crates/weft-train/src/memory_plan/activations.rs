//! Activation memory per rank. For a transformer, Korthikanti et al. ("Reducing Activation
//! Recomputation in Large Transformer Models", 2022): each layer keeps s·b·h·(34 + 5·a·s/h)
//! bytes of 16-bit activations (dropout masks included), s·b·h·(10 + 24/t + 5·a·s/(h·t))
//! under t-way tensor parallelism; with full recomputation only the layer's 16-bit input,
//! 2·s·b·h, plus one layer's activations while it is recomputed. The logits and their
//! gradient add 4·s·b·V/t bytes (fp32, for the loss). Recomputing the attention halves only
//! keeps their input instead of their activations (and one half's while it is recomputed).
//! Under 1F1B the first of p stages holds
//! p micro-batches in flight, so a stage of L/p layers keeps L layers' worth of one
//! micro-batch. A Llama-family model counts the tensors weft's layers keep ([`llama`]). For a
//! built-in CNN the bytes per sample are measured: one sample's forward pass on the CPU,
//! counting what the block-wise tape keeps for backward.

use super::{ModelShape, PlanSettings, Row};
use crate::flags::Recompute;

/// The activation row for one rank.
pub(super) fn row(settings: &PlanSettings, model: &ModelShape) -> Row {
    let b = settings.batch_size as u64;
    match model {
        ModelShape::Transformer {
            layers,
            hidden,
            heads,
            seq_len,
            vocab,
            ..
        } => transformer(settings, (*layers, *hidden, *heads), (*seq_len, *vocab), b),
        ModelShape::Llama { .. } => llama(settings, model, b),
        ModelShape::Measured {
            activation_bytes_per_sample,
            ..
        } => {
            let compute = settings.precision.compute.size_in_bytes() as u64;
            let per_sample = activation_bytes_per_sample * compute / 4;
            let note = match settings.checkpoint_activations {
                Recompute::None => "",
                _ => " (--checkpoint-activations is not planned for CNNs: not counted)",
            };
            Row::new(
                "activations",
                per_sample * b,
                format!(
                    "b·{per_sample} B: one sample's saved tensors, measured on the CPU in fp32, \
                     ×{compute}/4 for the compute dtype{note}"
                ),
            )
        }
    }
}

fn transformer(
    settings: &PlanSettings,
    (layers, h, a): (u64, u64, u64),
    (s, vocab): (u64, u64),
    b: u64,
) -> Row {
    let t = settings.tp as u64;
    let p = settings.pp as u64;
    let sbh = s * b * h;
    // Bytes of one layer's activations, with the attention scores' term exact in integers.
    let full_layer = match t {
        1 => sbh * 34 + 5 * a * s * s * b,
        _ => sbh * 10 + sbh * 24 / t + 5 * a * s * s * b / t,
    };
    let logits = 4 * s * b * vocab / t;
    // Layers whose activations one rank keeps for one micro-batch: all L under 1F1B's first
    // stage (L/p layers × p micro-batches), L without pipelining.
    let kept_layers = layers.div_ceil(p) * p.min(layers);
    // The attention half (its LayerNorm included) and the MLP half of a layer.
    let attention = match t {
        1 => sbh * 13 + 5 * a * s * s * b,
        _ => sbh * 5 + sbh * 8 / t + 5 * a * s * s * b / t,
    };
    let (bytes, formula) = match settings.checkpoint_activations {
        Recompute::None => (
            kept_layers * full_layer + logits,
            match t {
                1 => "L·s·b·h·(34 + 5·a·s/h) + 4·s·b·V",
                _ => "L·s·b·h·(10 + 24/t + 5·a·s/(h·t)) + 4·s·b·V/t",
            },
        ),
        Recompute::Full => (
            kept_layers * 2 * sbh + full_layer + logits,
            "L·2·s·b·h (layer inputs) + one layer recomputed + 4·s·b·V/t",
        ),
        Recompute::Attention => (
            kept_layers * (full_layer - attention + 2 * sbh) + attention + logits,
            "L·s·b·h·(7 + 16/t) (attention inputs, MLP halves) + one attention half recomputed (s·b·h·(13 or 5 + 8/t) + 5·a·s²·b/t) + 4·s·b·V/t",
        ),
    };
    Row::new("activations", bytes, formula.to_string())
}

/// A Llama layer's saved tensors (`llama/explicit.rs`), in the compute dtype (e bytes), under
/// t-way tensor parallelism: the attention half keeps its input and its RMSNorm's output (h
/// each), the rotated q | k | v rows ((a + 2 kv)·d/t), the attention's output (a·d/t) and
/// each query row's log-sum-exp (4 bytes × a/t), never the s × s weights; the MLP half its
/// input and RMSNorm output (h each), the gate, the up projection and their SwiGLU (ffn/t
/// each). The head keeps its input and RMSNorm output, and the logits and their gradient
/// (V/t each). Full recomputation keeps each half's input and recomputes one layer.
fn llama(settings: &PlanSettings, model: &ModelShape, b: u64) -> Row {
    let ModelShape::Llama {
        layers,
        hidden: h,
        heads: a,
        kv_heads: kv,
        head_dim: d,
        ffn,
        seq_len: s,
        vocab,
        ..
    } = *model
    else {
        unreachable!("called for Llama shapes only")
    };
    let (t, p) = (settings.tp as u64, settings.pp as u64);
    let e = settings.precision.compute.size_in_bytes() as u64;
    let sb = s * b;
    let attention = e * sb * (2 * h + (a + 2 * kv) * d / t + a * d / t) + 4 * sb * a / t;
    let mlp = e * sb * (2 * h + 3 * ffn / t);
    let layer = attention + mlp;
    let head = e * sb * (2 * h + 2 * vocab / t);
    let kept_layers = layers.div_ceil(p) * p.min(layers);
    let (bytes, formula) = match settings.checkpoint_activations {
        Recompute::None => (
            kept_layers * layer + head,
            "L·s·b·(e·(4h + (2a + 2kv)·d/t + 3·ffn/t) + 4a/t) + e·s·b·(2h + 2V/t)",
        ),
        Recompute::Full => (
            kept_layers * 2 * e * sb * h + layer + head,
            "L·2·e·s·b·h (the halves' inputs) + one layer recomputed + e·s·b·(2h + 2V/t)",
        ),
        Recompute::Attention => (
            kept_layers * (e * sb * h + mlp) + attention + head,
            "L·s·b·e·(3h + 3·ffn/t) (attention inputs, MLP halves) + one attention half recomputed + e·s·b·(2h + 2V/t)",
        ),
    };
    Row::new("activations", bytes, formula.to_string())
}
