//! The Llama model against Hugging Face's names, its own properties (causality, rotary
//! positions that only matter relatively, grouped-query attention as repeated heads, Phi-3's
//! fused projections as the separate ones) and finite differences in f64.

use candle_core::{DType, Device, Tensor};
use weft_tensor::{BlockModel, Mode, Objective};

use super::attention::{rotary_tables, rotate};
use super::*;
use crate::loss::NextToken;
use crate::test_support::{assert_gradients_match_finite_differences, assert_tape_matches, tokens};

/// A small shape: 4 query heads of 4 over 2 key/value heads, 2 layers, 11 tokens.
fn tiny(seed: u64) -> LlamaConfig {
    let mut config = LlamaConfig::from_name("llama-tiny")
        .unwrap()
        .with_seed(seed);
    (
        config.vocab_size,
        config.hidden_size,
        config.intermediate_size,
    ) = (11, 16, 24);
    (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    ) = (4, 2, 4);
    config.max_position_embeddings = 8;
    config
}

fn logits(model: &BlockModel, ids: &Tensor) -> Vec<f64> {
    let out = model.forward(ids, Mode::EVAL).unwrap();
    out.flatten_all().unwrap().to_vec1().unwrap()
}

fn loss_of(model: &BlockModel, ids: &Tensor, targets: &Tensor) -> Tensor {
    let logits = model.forward(ids, Mode::TRAIN).unwrap();
    NextToken { vocab_size: 11 }
        .loss(&logits, targets)
        .unwrap()
        .loss
}

fn max_difference(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

#[test]
fn names_and_counts_follow_hugging_face() {
    let config = LlamaConfig::from_name("llama-tiny").unwrap();
    let model = llama(&config, DType::F32, &Device::Cpu).unwrap();
    let names: Vec<&str> = model
        .store()
        .entries()
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(names[0], "model.embed_tokens.weight");
    assert_eq!(
        &names[1..10],
        [
            "model.layers.0.input_layernorm.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.self_attn.v_proj.weight",
            "model.layers.0.self_attn.o_proj.weight",
            "model.layers.0.post_attention_layernorm.weight",
            "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.mlp.up_proj.weight",
            "model.layers.0.mlp.down_proj.weight",
        ]
    );
    assert_eq!(names.last(), Some(&"model.norm.weight"), "tied: no lm_head");
    let count: usize = model
        .store()
        .entries()
        .iter()
        .map(|e| e.var.elem_count())
        .sum();
    assert_eq!(count, config.num_parameters());
    assert_eq!(model.blocks().len(), 2 * config.num_hidden_layers + 2);
    let k = model
        .store()
        .get("model.layers.1.self_attn.k_proj.weight")
        .unwrap();
    assert_eq!(k.var.dims(), [2 * 16, 64]);

    let mut untied = tiny(0);
    untied.tie_word_embeddings = false;
    untied.architecture = Architecture::Phi3;
    let model = llama(&untied, DType::F32, &Device::Cpu).unwrap();
    let names: Vec<&str> = model
        .store()
        .entries()
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    assert!(names.contains(&"model.layers.1.self_attn.qkv_proj.weight"));
    assert!(names.contains(&"model.layers.0.mlp.gate_up_proj.weight"));
    assert_eq!(names.last(), Some(&"lm_head.weight"));
}

/// A position's logits depend on the tokens up to it only.
#[test]
fn later_tokens_do_not_change_earlier_logits() {
    let model = llama(&tiny(1), DType::F64, &Device::Cpu).unwrap();
    let a = tokens(1, 6, 11, 0);
    let mut changed: Vec<u32> = a.flatten_all().unwrap().to_vec1().unwrap();
    changed[4] = (changed[4] + 5) % 11;
    let b = Tensor::from_vec(changed, (1, 6), &Device::Cpu).unwrap();
    let (la, lb) = (logits(&model, &a), logits(&model, &b));
    assert_eq!(la[..4 * 11], lb[..4 * 11]);
    assert!(max_difference(&la[4 * 11..], &lb[4 * 11..]) > 1e-6);
}

/// Rotated by RoPE, a query at position p and a key at s score by p − s alone.
#[test]
fn rotary_scores_depend_on_the_distance_only() {
    let inverse = rope::inverse_frequencies(8, 10_000.0, None);
    let x = Tensor::from_vec(
        (0..8).map(|i| 0.3 * i as f64 - 1.0).collect::<Vec<_>>(),
        (1, 1, 1, 8),
        &Device::Cpu,
    )
    .unwrap();
    let y = Tensor::from_vec(
        (0..8).map(|i| (i as f64).sin()).collect::<Vec<_>>(),
        (1, 1, 1, 8),
        &Device::Cpu,
    )
    .unwrap();
    let (cos, sin) = rotary_tables(&inverse, 12, &x).unwrap();
    let at = |t: &Tensor, p: usize| {
        rotate(
            t,
            &cos.narrow(0, p, 1).unwrap(),
            &sin.narrow(0, p, 1).unwrap(),
        )
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
    };
    let score =
        |p: usize, s: usize| -> f64 { at(&x, p).iter().zip(at(&y, s)).map(|(a, b)| a * b).sum() };
    assert!((score(5, 2) - score(9, 6)).abs() < 1e-12);
    assert!((score(5, 2) - score(2, 5)).abs() > 1e-3);
}

/// Grouped-query attention is multi-head attention whose key/value heads repeat: query head h
/// reads key/value head h ÷ 2 here. A model with 4 key/value heads holding the 2 heads of a
/// grouped model, each twice in a row, computes its logits.
#[test]
fn grouped_heads_are_repeated_heads() {
    let grouped = llama(&tiny(2), DType::F64, &Device::Cpu).unwrap();
    let mut full_config = tiny(2);
    full_config.num_key_value_heads = 4;
    let full = llama(&full_config, DType::F64, &Device::Cpu).unwrap();
    for entry in full.store().entries() {
        let source = grouped.store().get(&entry.name).unwrap().tensor().clone();
        let value = match entry.name.contains("k_proj") || entry.name.contains("v_proj") {
            // [2 heads · 4, 16] to [4 heads · 4, 16]: each head's rows twice.
            true => source
                .reshape((2, 1, 4, 16))
                .unwrap()
                .broadcast_as((2, 2, 4, 16))
                .unwrap()
                .reshape((16, 16))
                .unwrap(),
            false => source,
        };
        entry.var.set(&value).unwrap();
    }
    let ids = tokens(2, 7, 11, 3);
    let difference = max_difference(&logits(&grouped, &ids), &logits(&full, &ids));
    assert!(difference < 1e-12, "{difference}");
}

/// Phi-3's fused projections hold the separate ones of a Llama model of the same shape and
/// seed, and compute its logits.
#[test]
fn fused_projections_compute_the_separate_ones() {
    let llama_model = llama(&tiny(3), DType::F64, &Device::Cpu).unwrap();
    let mut phi = tiny(3);
    phi.architecture = Architecture::Phi3;
    let phi_model = llama(&phi, DType::F64, &Device::Cpu).unwrap();
    let ids = tokens(2, 5, 11, 4);
    let difference = max_difference(&logits(&llama_model, &ids), &logits(&phi_model, &ids));
    assert!(difference < 1e-12, "{difference}");
}

/// Gradients of the next-token loss against central differences in f64 for a few values of
/// every parameter (the tied table's gradient sums the embedding's and the head's parts); the
/// same stencil and bound as the GPT's (five points, h = 1e-4, 1e-8 of max(|g|, 1e-2)).
#[test]
fn gradients_match_finite_differences_in_f64() {
    let model = llama(&tiny(5), DType::F64, &Device::Cpu).unwrap();
    for entry in model.store().entries() {
        let scaled = (entry.tensor() * 20.0).unwrap();
        let value = match entry.name.contains("norm") {
            true => (entry.tensor() + (scaled * 0.01).unwrap()).unwrap(),
            false => scaled,
        };
        entry.var.set(&value).unwrap();
    }
    let (ids, targets) = (tokens(2, 5, 11, 0), tokens(2, 5, 11, 1));
    assert_gradients_match_finite_differences(&model, |m| loss_of(m, &ids, &targets));
}

/// The block-wise backward (the layers' and the head's own backward, `explicit.rs`; the tied
/// table's two parts summed) gives the whole autograd graph's gradients up to summation order
/// (1e-12 in f64), with and without recomputing the blocks in backward, for Llama's separate
/// projections and Phi-3's fused ones (with an untied head).
#[test]
fn block_wise_backward_equals_the_whole_graph() {
    for architecture in [Architecture::Llama, Architecture::Phi3] {
        let mut config = tiny(6);
        config.architecture = architecture;
        config.tie_word_embeddings = architecture == Architecture::Llama;
        let model = llama(&config, DType::F64, &Device::Cpu).unwrap();
        assert!(model.blocks()[1].explicit().is_some());
        let (ids, targets) = (tokens(2, 6, 11, 3), tokens(2, 6, 11, 4));
        let reference = loss_of(&model, &ids, &targets).backward().unwrap();
        assert_tape_matches(&model, (&ids, &targets), 11, Mode::TRAIN, &reference);
    }
}

#[test]
fn too_long_a_sequence_is_an_error_naming_the_limit() {
    let model = llama(&tiny(7), DType::F32, &Device::Cpu).unwrap();
    let err = model
        .forward(&tokens(1, 9, 11, 0), Mode::EVAL)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("9 tokens exceed max_position_embeddings 8"),
        "{err}"
    );
}

/// Pipeline stages hold the whole model's values under its names; a last stage with a tied
/// head but no embeddings holds its own copy of the token table.
#[test]
fn stages_hold_the_whole_models_values() {
    for tied in [true, false] {
        let mut config = tiny(8);
        config.tie_word_embeddings = tied;
        let whole = llama(&config, DType::F32, &Device::Cpu).unwrap();
        let total = config.num_blocks();
        let mut names = Vec::new();
        for blocks in [0..2, 2..total - 1, total - 1..total] {
            let stage =
                llama_stage(&config, DType::F32, &Device::Cpu, blocks.clone(), None).unwrap();
            assert_eq!(stage.blocks().len(), blocks.len());
            for entry in stage.store().entries() {
                let expected = whole.store().get(&entry.name).unwrap().tensor();
                let diff = (entry.tensor() - expected).unwrap().abs().unwrap();
                let diff = diff.max_all().unwrap().to_scalar::<f32>().unwrap();
                assert_eq!(diff, 0.0, "{}", entry.name);
                names.push(entry.name.clone());
            }
        }
        let copies = names
            .iter()
            .filter(|n| *n == "model.embed_tokens.weight")
            .count();
        assert_eq!(copies, if tied { 2 } else { 1 }, "tied {tied}");
        assert!(llama_stage(&config, DType::F32, &Device::Cpu, 3..3, None).is_err());
    }
}
