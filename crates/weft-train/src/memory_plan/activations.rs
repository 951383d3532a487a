//! Activation memory per rank. For a transformer, Korthikanti et al. ("Reducing Activation
//! Recomputation in Large Transformer Models", 2022): each layer keeps s·b·h·(34 + 5·a·s/h)
//! bytes of 16-bit activations (dropout masks included), s·b·h·(10 + 24/t + 5·a·s/(h·t))
//! under t-way tensor parallelism; with full recomputation only the layer's 16-bit input,
//! 2·s·b·h, plus one layer's activations while it is recomputed. The logits and their
//! gradient add 4·s·b·V/t bytes (fp32, for the loss). Under 1F1B the first of p stages holds
//! p micro-batches in flight, so a stage of L/p layers keeps L layers' worth of one
//! micro-batch. For a built-in CNN the bytes per sample are measured: one sample's forward
//! pass on the CPU, counting what the block-wise tape keeps for backward.

use super::{ModelShape, PlanSettings, Row};

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
        ModelShape::Measured {
            activation_bytes_per_sample,
            ..
        } => {
            let compute = settings.precision.compute.size_in_bytes() as u64;
            let per_sample = activation_bytes_per_sample * compute / 4;
            let checkpointed = settings.checkpoint_activations;
            let note = match checkpointed {
                true => " (--checkpoint-activations is not planned for CNNs: not counted)",
                false => "",
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
    let (bytes, formula) = match settings.checkpoint_activations {
        false => (
            kept_layers * full_layer + logits,
            match t {
                1 => "L·s·b·h·(34 + 5·a·s/h) + 4·s·b·V",
                _ => "L·s·b·h·(10 + 24/t + 5·a·s/(h·t)) + 4·s·b·V/t",
            },
        ),
        true => (
            kept_layers * 2 * sbh + full_layer + logits,
            "L·2·s·b·h (layer inputs) + one layer recomputed + 4·s·b·V/t",
        ),
    };
    Row::new("activations", bytes, formula.to_string())
}
