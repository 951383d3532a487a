//! The Llama family against `transformers` itself: tiny random `LlamaForCausalLM` (grouped-query
//! attention, Llama 3's rope scaling, a tied head) and `Phi3ForCausalLM` (fused projections)
//! folders written by `save_pretrained`, with the logits `transformers` 5.17 computed for their
//! input ids in f32 (`xtask/python/llama_fixture.py`, run once on the GPU machine; CI runs no
//! Python). weft reads the `config.json`, loads the weights and reproduces the logits within
//! 1e-5 of their largest magnitude (f32 rounding of the same math in another order is about
//! 1e-7; a misplaced rotary pair or key/value head is of the order of the logits themselves).

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use weft_models::llama::{hf, llama, LlamaConfig};
use weft_tensor::Mode;

fn check(name: &str) {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name);
    let path = folder.join("config.json");
    let config = LlamaConfig::from_hf_json(&std::fs::read_to_string(&path).unwrap(), &path);
    let config = config.unwrap();
    let model = llama(&config, DType::F32, &Device::Cpu).unwrap();
    hf::load_hf(model.store(), &config, &folder).unwrap();
    let expected =
        candle_core::safetensors::load(folder.join("expected.safetensors"), &Device::Cpu).unwrap();
    let ids = expected["input_ids"].to_dtype(DType::U32).unwrap();
    let logits = model.forward(&ids, Mode::EVAL).unwrap();
    let reference: &Tensor = &expected["logits"];
    assert_eq!(logits.dims(), reference.dims(), "{name}");
    let largest = reference.abs().unwrap().max_all().unwrap();
    let largest = largest.to_scalar::<f32>().unwrap();
    let diff = (logits - reference)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap();
    let diff = diff.to_scalar::<f32>().unwrap();
    assert!(largest > 0.1, "{name}: logits of {largest}");
    assert!(diff <= 1e-5 * largest, "{name}: {diff} of {largest}");
}

#[test]
fn llama_reproduces_transformers_logits() {
    check("llama");
}

#[test]
fn phi3_reproduces_transformers_logits() {
    check("phi3");
}
