//! The GPT against hand-computed values, finite differences and Hugging Face's names.

use candle_core::{DType, Device, Tensor};
use weft_tensor::{tape, BlockModel, Checkpointing, Mode, Objective};

use super::*;
use crate::loss::NextToken;
use crate::test_support::{assert_gradients_match_finite_differences, assert_tape_matches, tokens};

fn tiny(seed: u64) -> GptConfig {
    let mut config = GptConfig::from_name("gpt-tiny").unwrap().with_seed(seed);
    config.vocab_size = 11;
    config.vocab_multiple = 8;
    config.n_embd = 8;
    config.n_head = 2;
    config.n_layer = 2;
    config.context = 6;
    config
}

fn set(model: &BlockModel, name: &str, value: Tensor) {
    let entry = model.store().get(name).unwrap();
    entry
        .var
        .set(&value.reshape(entry.var.dims()).unwrap())
        .unwrap();
}

#[test]
fn names_order_and_count_follow_hugging_face() {
    let config = GptConfig::from_name("gpt-tiny").unwrap();
    let model = gpt(&config, DType::F32, &Device::Cpu).unwrap();
    let names: Vec<&str> = model
        .store()
        .entries()
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(
        &names[..8],
        [
            "transformer.wte.weight",
            "transformer.wpe.weight",
            "transformer.h.0.ln_1.weight",
            "transformer.h.0.ln_1.bias",
            "transformer.h.0.attn.c_attn.weight",
            "transformer.h.0.attn.c_attn.bias",
            "transformer.h.0.attn.c_proj.weight",
            "transformer.h.0.attn.c_proj.bias",
        ]
    );
    assert_eq!(
        &names[names.len() - 2..],
        ["transformer.ln_f.weight", "transformer.ln_f.bias"]
    );
    assert_eq!(names.len(), 2 + 12 * config.n_layer + 2);
    let c_attn = model
        .store()
        .get("transformer.h.1.attn.c_attn.weight")
        .unwrap();
    assert_eq!(c_attn.var.dims(), [64, 192], "Conv1D layout: [in, out]");
    assert_eq!(model.store().num_parameters(), config.num_parameters());
    assert!((200_000..400_000).contains(&config.num_parameters()));
    let blocks: Vec<&str> = model.blocks().iter().map(|b| b.name()).collect();
    let layers = (0..4).flat_map(|l| [format!("h.{l}.attn"), format!("h.{l}.mlp")]);
    let expected: Vec<String> = std::iter::once("embeddings".to_string())
        .chain(layers)
        .chain(std::iter::once("head".to_string()))
        .collect();
    assert_eq!(blocks, expected);
}

fn std_of(model: &BlockModel, name: &str) -> f64 {
    let v: Vec<f64> = model
        .store()
        .get(name)
        .unwrap()
        .tensor()
        .flatten_all()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1()
        .unwrap();
    (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt()
}

/// Hugging Face's `_init_weights`: std 0.02, the residual projections 0.02 / sqrt(2 · 4) for
/// four layers (12,288 to 16,384 samples: the sample std is within 2 %); the padding rows zero.
#[test]
fn initialisation_follows_hugging_face() {
    let config = GptConfig::from_name("gpt-tiny")
        .unwrap()
        .with_vocab_size(250);
    let model = gpt(&config, DType::F32, &Device::Cpu).unwrap();
    for (name, expected) in [
        ("transformer.h.0.attn.c_attn.weight", 0.02),
        ("transformer.h.2.mlp.c_fc.weight", 0.02),
        ("transformer.h.1.mlp.c_proj.weight", 0.02 / 8f64.sqrt()),
        ("transformer.h.3.attn.c_proj.weight", 0.02 / 8f64.sqrt()),
    ] {
        let std = std_of(&model, name);
        assert!(
            (std / expected - 1.0).abs() < 0.02,
            "{name}: {std} vs {expected}"
        );
    }
    let table = model
        .store()
        .get("transformer.wte.weight")
        .unwrap()
        .tensor()
        .clone();
    assert_eq!(table.dims(), [256, 64]);
    let padding = table
        .narrow(0, 250, 6)
        .unwrap()
        .abs()
        .unwrap()
        .sum_all()
        .unwrap();
    assert_eq!(padding.to_scalar::<f32>().unwrap(), 0.0);
}

/// One layer of width 2, one head; the values make every step computable by hand:
/// tokens 0 and 1 are `[2, 0]` and `[0, 2]`, which `ln_1` maps to `[1, -1]` and `[-1, 1]`
/// (eps 0). Queries and keys are zero and values copy `ln_1`'s output, so attention averages
/// the past: position 0 gets `[1, -1]`, position 1 `[0, 0]`; `c_proj` is the identity. The
/// MLP's weights are zero, so it adds its last bias `[0, 0.25]`:
/// `h = [3, -0.75]` and `[0, 2.25]`; `ln_f` gives `[1, -1]` and `[-1, 1]`, and the tied head
/// multiplies by the table `[[2, 0], [0, 2], [1, 1], 0]`: logits `[2, -2, 0, 0]` and
/// `[-2, 2, 0, 0]`.
#[test]
fn forward_matches_a_hand_computed_case() {
    let mut config = tiny(0);
    (
        config.vocab_size,
        config.vocab_multiple,
        config.n_embd,
        config.n_head,
    ) = (3, 4, 2, 1);
    (config.n_layer, config.context, config.layer_norm_eps) = (1, 2, 0.0);
    let model = gpt(&config, DType::F64, &Device::Cpu).unwrap();
    for entry in model.store().entries() {
        entry.var.set(&entry.var.zeros_like().unwrap()).unwrap();
    }
    let t = |v: &[f64]| Tensor::new(v, &Device::Cpu).unwrap();
    set(
        &model,
        "transformer.wte.weight",
        t(&[2., 0., 0., 2., 1., 1., 0., 0.]),
    );
    for ln in ["h.0.ln_1", "h.0.ln_2", "ln_f"] {
        set(&model, &format!("transformer.{ln}.weight"), t(&[1., 1.]));
    }
    // c_attn [2, 6]: q and k columns zero, v columns the identity.
    set(
        &model,
        "transformer.h.0.attn.c_attn.weight",
        t(&[0., 0., 0., 0., 1., 0., 0., 0., 0., 0., 0., 1.]),
    );
    set(
        &model,
        "transformer.h.0.attn.c_proj.weight",
        t(&[1., 0., 0., 1.]),
    );
    set(&model, "transformer.h.0.mlp.c_proj.bias", t(&[0., 0.25]));
    let ids = Tensor::new(&[[0u32, 1]], &Device::Cpu).unwrap();
    let logits = model.forward(&ids, Mode::EVAL).unwrap();
    let logits: Vec<Vec<f64>> = logits.squeeze(0).unwrap().to_vec2().unwrap();
    assert_eq!(logits, [[2., -2., 0., 0.], [-2., 2., 0., 0.]]);
    // Targets 1 then 0: each -log(e^-2 / (e^2 + e^-2 + 1)); the padded column is not counted.
    let targets = Tensor::new(&[[1u32, 0]], &Device::Cpu).unwrap();
    let out = model.forward(&ids, Mode::EVAL).unwrap();
    let loss = NextToken { vocab_size: 3 }
        .loss(&out, &targets)
        .unwrap()
        .loss;
    let expected = 2.0 + (2f64.exp() + (-2f64).exp() + 1.0).ln();
    assert!((loss.to_scalar::<f64>().unwrap() - expected).abs() < 1e-12);
}

fn loss_of(model: &BlockModel, ids: &Tensor, targets: &Tensor, vocab: usize) -> Tensor {
    let logits = model.forward(ids, Mode::TRAIN).unwrap();
    NextToken { vocab_size: vocab }
        .loss(&logits, targets)
        .unwrap()
        .loss
}

/// Gradients of the next-token loss against central differences in f64, for a few values of
/// every parameter (the tied table included: its gradient sums the embedding's and the head's
/// parts). The five-point stencil with step 1e-4 has truncation error O(h⁴) ≈ 1e-16 times the
/// fifth derivative and a rounding error near 1e-11 (losses of order 1, ten evaluations); the
/// bound 1e-8 relative to max(|g|, 1e-2) allows that and still fails on a gradient that is
/// wrong by 1e-7 of itself (Candle's own GELU backward, for one).
#[test]
fn gradients_match_finite_differences_in_f64() {
    let config = tiny(5);
    let model = gpt(&config, DType::F64, &Device::Cpu).unwrap();
    // Larger weights than the 0.02 initialisation, so every path carries a visible gradient.
    for entry in model.store().entries() {
        let scaled = (entry.tensor() * 20.0).unwrap();
        let shift = Tensor::ones_like(entry.tensor()).unwrap();
        let value = match entry.name.contains("ln_") {
            true => (scaled + shift).unwrap(),
            false => scaled,
        };
        entry.var.set(&value).unwrap();
    }
    let (ids, targets) = (tokens(2, 5, 11, 0), tokens(2, 5, 11, 1));
    assert_gradients_match_finite_differences(&model, |m| loss_of(m, &ids, &targets, 11));
}

/// The block-wise backward (each block's graph cut at its input, the tied table's two parts
/// summed and reported with the embeddings) gives the whole graph's gradients exactly up to
/// summation order (1e-12 in f64).
/// Also with dropout: the masks derive from the mode's seed, so the whole graph, the block-wise
/// tape and the checkpointed tape (its blocks recomputed in backward) drop the same elements.
#[test]
fn block_wise_backward_equals_the_whole_graph() {
    for dropout in [0.0, 0.2] {
        block_wise_backward_equals_the_whole_graph_with(dropout);
    }
}

fn block_wise_backward_equals_the_whole_graph_with(dropout: f64) {
    let config = tiny(2).with_dropout(dropout);
    let model = gpt(&config, DType::F64, &Device::Cpu).unwrap();
    let (ids, targets) = (tokens(2, 6, 11, 3), tokens(2, 6, 11, 4));
    let mode = Mode::TRAIN.with_dropout_seed(17);
    let logits = model.forward(&ids, mode).unwrap();
    let loss = NextToken { vocab_size: 11 }
        .loss(&logits, &targets)
        .unwrap()
        .loss;
    let undropped = loss_of(&model, &ids, &targets, 11);
    let moved = (&loss - &undropped)
        .unwrap()
        .abs()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    // f64: any dropped element moves the loss far beyond rounding.
    assert_eq!(
        moved > 1e-9,
        dropout > 0.0,
        "dropout {dropout} moved the loss by {moved}"
    );
    let reference = loss.backward().unwrap();
    // The halves differentiate themselves, dropout or not, except the attention with dropout
    // on the CPU (its weights' dropout is fused in cuDNN only: the tape records the graph).
    let layer = model.blocks()[1].explicit().expect("a transformer layer");
    let embedded = model.blocks()[0].forward(&ids, mode).unwrap();
    let own = layer.forward_saving(&embedded, mode).unwrap().is_some();
    assert_eq!(own, dropout == 0.0, "dropout {dropout}");
    let mlp = model.blocks()[2].explicit().expect("a transformer layer");
    let own = mlp.forward_saving(&embedded, mode).unwrap().is_some();
    assert!(own, "dropout {dropout}: the MLP half");
    let embeddings = model.blocks()[0].explicit().expect("the embeddings");
    assert!(embeddings.forward_saving(&ids, mode).unwrap().is_some());
    // The head (no dropout in it) always differentiates itself.
    let head = model.blocks().last().unwrap();
    let hidden = Tensor::zeros(embedded.dims(), DType::F64, &Device::Cpu).unwrap();
    let saving = head
        .explicit()
        .expect("the head")
        .forward_saving(&hidden, mode);
    assert!(saving.unwrap().is_some(), "dropout {dropout}: the head");
    assert_tape_matches(&model, (&ids, &targets), 11, mode, &reference);
}

/// A checkpoint exported with Hugging Face's names (the table cut to the vocabulary, no
/// `lm_head`) loads into a differently seeded model and gives the same logits; the hub's
/// unprefixed names, its tied head and its mask buffers load too; a missing or misshapen key
/// is an error naming it.
#[test]
fn hugging_face_checkpoints_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let config = tiny(7);
    let a = gpt(&config, DType::F32, &Device::Cpu).unwrap();
    hf::save_hf_safetensors(a.store(), &config, &path).unwrap();
    let saved = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    assert_eq!(saved["transformer.wte.weight"].dims(), [11, 8]);
    assert!(!saved.contains_key("lm_head.weight"));
    let b = gpt(&config.clone().with_seed(8), DType::F32, &Device::Cpu).unwrap();
    hf::load_hf_safetensors(b.store(), &config, &path).unwrap();
    let ids = tokens(1, 6, 11, 0);
    let (la, lb) = (
        a.forward(&ids, Mode::EVAL).unwrap(),
        b.forward(&ids, Mode::EVAL).unwrap(),
    );
    assert_eq!(
        la.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        lb.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    );

    // The hub's layout: no prefix, plus the tied head and a mask buffer.
    let mut hub: std::collections::HashMap<String, Tensor> = saved
        .iter()
        .map(|(k, v)| (k.trim_start_matches("transformer.").to_string(), v.clone()))
        .collect();
    hub.insert(
        "lm_head.weight".into(),
        saved["transformer.wte.weight"].clone(),
    );
    hub.insert(
        "h.0.attn.bias".into(),
        Tensor::ones((1, 1, 6, 6), DType::F32, &Device::Cpu).unwrap(),
    );
    let hub_path = dir.path().join("hub.safetensors");
    candle_core::safetensors::save(&hub, &hub_path).unwrap();
    let c = gpt(&config.clone().with_seed(9), DType::F64, &Device::Cpu).unwrap();
    hf::load_hf_safetensors(c.store(), &config, &hub_path).unwrap();
    let lc = c
        .forward(&ids, Mode::EVAL)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let diff = (lc - &la)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(diff < 1e-5, "{diff}");

    hub.remove("h.1.mlp.c_fc.bias");
    hub.insert(
        "h.0.ln_1.weight".into(),
        Tensor::ones(3, DType::F32, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&hub, &hub_path).unwrap();
    let err = hf::load_hf_safetensors(c.store(), &config, &hub_path)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("transformer.h.0.ln_1.weight") && err.contains("hub.safetensors"),
        "{err}"
    );
    hub.insert(
        "h.0.ln_1.weight".into(),
        Tensor::ones(8, DType::F32, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&hub, &hub_path).unwrap();
    let err = hf::load_hf_safetensors(c.store(), &config, &hub_path)
        .unwrap_err()
        .to_string();
    assert!(err.contains("transformer.h.1.mlp.c_fc.bias"), "{err}");
}

#[test]
fn too_long_a_sequence_is_an_error_naming_the_context() {
    let model = gpt(&tiny(0), DType::F32, &Device::Cpu).unwrap();
    let err = model
        .forward(&tokens(1, 7, 11, 0), Mode::EVAL)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("7 tokens") && err.contains("context of 6"),
        "{err}"
    );
}

/// A pipeline's stages are the whole model cut apart: every stage parameter has the value of
/// the same-named parameter of the whole model (the last stage's token table copy included),
/// and running the stages one after another gives the whole model's logits exactly.
#[test]
fn stages_chained_equal_the_whole_model() {
    let config = tiny(3);
    let (dtype, device) = (DType::F64, Device::Cpu);
    let whole = gpt(&config, dtype, &device).unwrap();
    // Cut inside a layer too: between h.0's attention and its MLP.
    let cuts = [0..2, 2..5, 5..6];
    let stages: Vec<BlockModel> = cuts
        .iter()
        .map(|r| gpt_stage(&config, dtype, &device, &Dense, r.clone()).unwrap())
        .collect();
    for stage in &stages {
        for entry in stage.store().entries() {
            let full = whole.store().get(&entry.name).unwrap().tensor().clone();
            let diff = (entry.tensor() - full).unwrap().abs().unwrap();
            let diff = diff.flatten_all().unwrap().max(0).unwrap();
            assert_eq!(diff.to_scalar::<f64>().unwrap(), 0.0, "{}", entry.name);
        }
    }
    let last = stages[2].store();
    assert!(
        last.get("transformer.wte.weight").is_ok(),
        "the head's copy"
    );
    assert_eq!(stages[2].parameters_used_by(0).len(), last.len(), "owned");
    let ids = tokens(2, 5, 11, 7);
    let mut h = ids.clone();
    for stage in &stages {
        h = tape::infer(stage, &h, Mode::EVAL).unwrap();
    }
    let expected = tape::infer(&whole, &ids, Mode::EVAL).unwrap();
    let diff = (h - expected)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap();
    assert_eq!(diff.max(0).unwrap().to_scalar::<f64>().unwrap(), 0.0);

    // Each stage loads its part of a whole-model checkpoint; an unknown key is still refused.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    hf::save_hf_safetensors(whole.store(), &config, &path).unwrap();
    let other = config.clone().with_seed(4);
    for r in &cuts {
        let stage = gpt_stage(&other, dtype, &device, &Dense, r.clone()).unwrap();
        hf::load_hf_safetensors(stage.store(), &config, &path).unwrap();
        for entry in stage.store().entries() {
            let full = whole.store().get(&entry.name).unwrap().tensor().clone();
            let diff = (entry.tensor() - full).unwrap().abs().unwrap();
            let diff = diff.flatten_all().unwrap().max(0).unwrap();
            assert_eq!(diff.to_scalar::<f64>().unwrap(), 0.0, "{}", entry.name);
        }
    }
    let mut saved = candle_core::safetensors::load(&path, &device).unwrap();
    saved.insert(
        "transformer.h.7.ln_1.bias".into(),
        Tensor::zeros(8, dtype, &device).unwrap(),
    );
    candle_core::safetensors::save(&saved, &path).unwrap();
    let err = hf::load_hf_safetensors(stages[1].store(), &config, &path).unwrap_err();
    assert!(err.to_string().contains("h.7.ln_1.bias"), "{err}");

    let Err(err) = gpt_stage(&config, dtype, &device, &Dense, 5..7) else {
        panic!("blocks past the head were accepted");
    };
    assert!(err.to_string().contains("5..7"), "{err}");
}

/// Every parameter's gradient by the block-wise tape, flattened in store order, as f64.
fn tape_gradients(model: &BlockModel, ids: &Tensor, targets: &Tensor) -> Vec<f64> {
    let tape = tape::forward(model, ids, Mode::TRAIN, &Checkpointing::None).unwrap();
    let out = NextToken { vocab_size: 11 }
        .loss(tape.output(), targets)
        .unwrap();
    let mut grads = vec![Vec::new(); model.store().entries().len()];
    tape.backward(&out.loss, model, |ready| {
        for (id, grad) in ready.grads {
            let g = grad.unwrap().to_dtype(DType::F64)?.flatten_all()?;
            grads[id] = g.to_vec1::<f64>()?;
        }
        Ok::<(), weft_tensor::TensorError>(())
    })
    .unwrap();
    grads.concat()
}

/// A bf16 GPT on the CPU takes the layers' own backward (attention, LayerNorm, GELU and the
/// bias add computing in f32 inside and rounding once, as on a GPU), and its gradients agree
/// with the f64 model's of the same seed: relative L2 error within 2^-5 (8 units of bf16's
/// rounding step 2^-8 through two layers and the tied head; measured 1.7 units).
#[test]
fn bf16_layers_differentiate_themselves_and_agree_with_f64() {
    let (ids, targets) = (tokens(2, 6, 11, 3), tokens(2, 6, 11, 4));
    let reference = tape_gradients(
        &gpt(&tiny(2), DType::F64, &Device::Cpu).unwrap(),
        &ids,
        &targets,
    );
    let model = gpt(&tiny(2), DType::BF16, &Device::Cpu).unwrap();
    let layer = model.blocks()[1].explicit().expect("a transformer layer");
    let embedded = model.blocks()[0].forward(&ids, Mode::TRAIN).unwrap();
    assert!(layer
        .forward_saving(&embedded, Mode::TRAIN)
        .unwrap()
        .is_some());
    let half = tape_gradients(&model, &ids, &targets);
    let (mut diff, mut norm) = (0.0, 0.0);
    for (a, b) in reference.iter().zip(&half) {
        diff += (a - b) * (a - b);
        norm += a * a;
    }
    let error = (diff / norm).sqrt();
    assert!(error <= 2f64.powi(-5), "bf16 against f64: {error}");
}

/// The embeddings block differentiates itself when its table is whole (`ops::embed_tokens`,
/// keeping only the ids; with dropout the seeds too), with the output of Candle's lookup exactly; the
/// tape's gradients through it (the table's rows summed per id plus the tied head's part, the
/// positions' rows, zero past the sequence) equal Candle's autograd over the whole graph within
/// 1e-12 in f64, repeated ids and ids absent (the padded rows among them) included.
#[test]
fn explicit_embeddings_equal_autograd_in_f64() {
    let model = gpt(&tiny(6), DType::F64, &Device::Cpu).unwrap();
    // Five tokens of a context of six; eleven ids over the sixteen padded rows.
    let (ids, targets) = (tokens(2, 5, 11, 5), tokens(2, 5, 11, 6));
    let block = &model.blocks()[0];
    let embeddings = block.explicit().expect("the embeddings");
    let (h, saved) = embeddings
        .forward_saving(&ids, Mode::TRAIN)
        .unwrap()
        .expect("a whole table, no dropout");
    assert_eq!(saved.len(), 1, "only the ids");
    let graph = block.forward(&ids, Mode::TRAIN).unwrap();
    let diff = (&h - &graph).unwrap().abs().unwrap().flatten_all().unwrap();
    assert_eq!(diff.max(0).unwrap().to_scalar::<f64>().unwrap(), 0.0);
    // With dropout it keeps the mode's seeds too, and drops what the graph drops.
    let dropping = gpt(&tiny(6).with_dropout(0.1), DType::F64, &Device::Cpu).unwrap();
    let block = &dropping.blocks()[0];
    let mode = Mode::TRAIN.with_dropout_seed(3).with_dropout_step(8);
    let (h, saved) = block
        .explicit()
        .expect("the embeddings")
        .forward_saving(&ids, mode)
        .unwrap()
        .expect("a whole table");
    assert_eq!(saved.len(), 2, "the ids and the seeds");
    let graph = block.forward(&ids, mode).unwrap();
    let diff = (&h - &graph).unwrap().abs().unwrap().flatten_all().unwrap();
    assert_eq!(diff.max(0).unwrap().to_scalar::<f64>().unwrap(), 0.0);

    let reference = loss_of(&model, &ids, &targets, 11).backward().unwrap();
    let tape = tape::forward(&model, &ids, Mode::TRAIN, &Checkpointing::None).unwrap();
    let out = NextToken { vocab_size: 11 }
        .loss(tape.output(), &targets)
        .unwrap();
    let mut seen = Vec::new();
    tape.backward(&out.loss, &model, |ready| {
        for (id, grad) in ready.grads {
            let entry = &model.store().entries()[id];
            let expected = reference.get(entry.tensor()).unwrap();
            let diff = (grad.unwrap() - expected)
                .and_then(|d| d.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>())
                .map_err(weft_tensor::TensorError::from)?;
            assert!(diff < 1e-12, "{}: {diff}", entry.name);
            seen.push(entry.name.clone());
        }
        Ok::<(), weft_tensor::TensorError>(())
    })
    .unwrap();
    assert!(seen.iter().any(|name| name == "transformer.wte.weight"));
    assert!(seen.iter().any(|name| name == "transformer.wpe.weight"));
    assert_eq!(seen.len(), model.store().parameter_ids().len());
    let wpe = reference
        .get(
            model
                .store()
                .get("transformer.wpe.weight")
                .unwrap()
                .tensor(),
        )
        .unwrap()
        .to_vec2::<f64>()
        .unwrap();
    assert!(
        wpe[5].iter().all(|&g| g == 0.0),
        "the sixth position is unused"
    );
}
