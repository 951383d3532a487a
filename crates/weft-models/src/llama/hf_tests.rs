//! Hugging Face checkpoints of the Llama family: an export loads back into the same logits
//! (whole or sharded, Llama and Phi-3), its `config.json` reads back as the same shape, and a
//! missing or extra key is a one-line error naming it.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use weft_tensor::hf_checkpoint::save_weights;
use weft_tensor::{BlockModel, Mode};

use super::hf::{load_hf, save_hf};
use super::*;

fn config(architecture: Architecture, tied: bool) -> LlamaConfig {
    let mut config = LlamaConfig::from_name("llama-tiny").unwrap();
    config.architecture = architecture;
    config.tie_word_embeddings = tied;
    config
}

fn logits(model: &BlockModel) -> Vec<f32> {
    let ids = Tensor::new(&[[3u32, 9, 200, 17, 4]], &Device::Cpu).unwrap();
    let out = model.forward(&ids, Mode::EVAL).unwrap();
    out.flatten_all().unwrap().to_vec1().unwrap()
}

fn tensors(model: &BlockModel) -> Vec<(String, Tensor)> {
    let entries = model.store().entries();
    entries
        .iter()
        .map(|e| (e.name.clone(), e.tensor().clone()))
        .collect()
}

#[test]
fn an_export_loads_back_into_the_same_model() {
    for (architecture, tied) in [
        (Architecture::Llama, true),
        (Architecture::Llama, false),
        (Architecture::Phi3, false),
    ] {
        let config = config(architecture, tied);
        let trained = llama(&config.clone().with_seed(1), DType::F32, &Device::Cpu).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let written = save_hf(trained.store(), &config, dir.path()).unwrap();
        assert_eq!(written, [dir.path().join("model.safetensors")]);
        let text = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
        let read = LlamaConfig::from_hf_json(&text, &dir.path().join("config.json")).unwrap();
        let expected = LlamaConfig {
            name: read.name.clone(),
            ..config.clone()
        };
        assert_eq!(read, expected, "{architecture:?}");
        let fresh = llama(&config.clone().with_seed(2), DType::F32, &Device::Cpu).unwrap();
        assert_ne!(logits(&fresh), logits(&trained));
        load_hf(fresh.store(), &config, dir.path()).unwrap();
        assert_eq!(
            logits(&fresh),
            logits(&trained),
            "{architecture:?}, tied {tied}"
        );
    }
}

#[test]
fn sharded_checkpoints_load_through_their_index() {
    let config = config(Architecture::Llama, false);
    let trained = llama(&config.clone().with_seed(1), DType::F32, &Device::Cpu).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let written = save_weights(&tensors(&trained), dir.path(), 40_000).unwrap();
    assert!(written.len() > 3, "{written:?}");
    let fresh = llama(&config.clone().with_seed(2), DType::F32, &Device::Cpu).unwrap();
    load_hf(fresh.store(), &config, dir.path()).unwrap();
    assert_eq!(logits(&fresh), logits(&trained));
}

#[test]
fn bf16_weights_are_converted_to_the_models_dtype() {
    let config = config(Architecture::Llama, true);
    let model = llama(&config, DType::BF16, &Device::Cpu).unwrap();
    let dir = tempfile::tempdir().unwrap();
    save_hf(model.store(), &config, dir.path()).unwrap();
    let text = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    assert!(text.contains("\"torch_dtype\": \"bfloat16\""), "{text}");
    let wide = llama(&config.clone().with_seed(5), DType::F32, &Device::Cpu).unwrap();
    load_hf(wide.store(), &config, dir.path()).unwrap();
    let table = wide.store().entries()[0].tensor().clone();
    let rounded = model.store().entries()[0]
        .tensor()
        .to_dtype(DType::F32)
        .unwrap();
    let diff = (table - rounded).unwrap().abs().unwrap().max_all().unwrap();
    assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0);
}

/// Writes `tensors` as one safetensors file and loads it into a model of `config`.
fn load_edited(config: &LlamaConfig, tensors: HashMap<String, Tensor>) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    candle_core::safetensors::save(&tensors, &path).unwrap();
    let model = llama(config, DType::F32, &Device::Cpu).unwrap();
    load_hf(model.store(), config, &path).map_err(|e| e.to_string())
}

#[test]
fn tied_heads_and_rotary_buffers_are_skipped_and_other_keys_refused() {
    let config = config(Architecture::Llama, true);
    let model = llama(&config, DType::F32, &Device::Cpu).unwrap();
    let mut all: HashMap<String, Tensor> = tensors(&model).into_iter().collect();
    let table = all["model.embed_tokens.weight"].clone();
    all.insert("lm_head.weight".into(), table);
    let buffer = Tensor::zeros(8, DType::F32, &Device::Cpu).unwrap();
    all.insert(
        "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
        buffer,
    );
    load_edited(&config, all.clone()).unwrap();

    let mut extra = all.clone();
    extra.insert("model.layers.9.mlp.up_proj.weight".into(), table_row(&all));
    let error = load_edited(&config, extra).unwrap_err();
    assert!(error.contains("unexpected key `model.layers.9.mlp.up_proj.weight`"));
    assert!(
        error.contains("model.safetensors") && !error.contains('\n'),
        "{error}"
    );

    let mut missing = all;
    missing.remove("model.norm.weight");
    let error = load_edited(&config, missing).unwrap_err();
    assert!(error.contains("missing key `model.norm.weight`"), "{error}");
}

fn table_row(all: &HashMap<String, Tensor>) -> Tensor {
    all["model.embed_tokens.weight"].narrow(0, 0, 1).unwrap()
}

#[test]
fn a_folder_without_weights_names_itself() {
    let config = config(Architecture::Llama, true);
    let model = llama(&config, DType::F32, &Device::Cpu).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let error = load_hf(model.store(), &config, dir.path()).unwrap_err();
    let error = error.to_string();
    assert!(error.contains(&dir.path().display().to_string()), "{error}");
    assert!(error.contains("no model.safetensors"), "{error}");
}
