//! Hugging Face GPT-2 checkpoints in safetensors: loading one into a GPT (the hub's
//! `model.safetensors`, keys with or without the `transformer.` prefix, its 50257-row table
//! into the padded one) and exporting a GPT so that `GPT2LMHeadModel.from_pretrained` loads it
//! (`transformer.`-prefixed keys, the table cut back to the vocabulary, the tied head left out).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use candle_core::Tensor;
use weft_tensor::state_dict::{load_tensors, save_tensors};
use weft_tensor::{EntryId, ParamStore, TensorError};

use super::GptConfig;
use crate::error::Result;

const TABLE: &str = "transformer.wte.weight";

/// Keys a GPT-2 checkpoint may hold that are not parameters: the tied head and the causal
/// mask buffers of older `transformers` versions.
fn is_ignored(key: &str) -> bool {
    key == "lm_head.weight" || key.ends_with(".attn.bias") || key.ends_with(".attn.masked_bias")
}

/// Every parameter name of the whole GPT of `config`, as this crate names them.
fn parameter_names(config: &GptConfig) -> HashSet<String> {
    let mut names: HashSet<String> = ["wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"]
        .map(|n| format!("transformer.{n}"))
        .into();
    let parts = [
        "ln_1",
        "attn.c_attn",
        "attn.c_proj",
        "ln_2",
        "mlp.c_fc",
        "mlp.c_proj",
    ];
    for layer in 0..config.n_layer {
        for part in parts {
            for kind in ["weight", "bias"] {
                names.insert(format!("transformer.h.{layer}.{part}.{kind}"));
            }
        }
    }
    names
}

/// Loads the GPT-2 checkpoint at `path` into `store` (a GPT of `config`, or a pipeline stage
/// of one: keys of the other stages' blocks are skipped): every parameter must be there with
/// its shape; the token table may have `vocab_size` rows (padded here with
/// zeros) or the padded count. Values are converted to the store's dtype.
pub fn load_hf_safetensors(store: &ParamStore, config: &GptConfig, path: &Path) -> Result<()> {
    load_hf_safetensors_sliced(store, config, path, |_, full| Ok(full.clone()))
}

/// [`load_hf_safetensors`] into a store holding parts of the parameters (a tensor-parallel
/// rank's slices): `part(id, full)` gives entry `id`'s part of the full value, which must then
/// have the entry's shape.
pub fn load_hf_safetensors_sliced(
    store: &ParamStore,
    config: &GptConfig,
    path: &Path,
    part: impl Fn(EntryId, &Tensor) -> Result<Tensor>,
) -> Result<()> {
    let loaded = candle_core::safetensors::load(path, store.device()).map_err(|source| {
        TensorError::Safetensors {
            file: path.into(),
            source,
        }
    })?;
    let known = parameter_names(config);
    let mut unexpected: Vec<&String> = loaded
        .keys()
        .filter(|k| !is_ignored(k) && !known.contains(&with_prefix(k)))
        .collect();
    unexpected.sort();
    if let Some(key) = unexpected.first() {
        return Err(TensorError::UnexpectedKey {
            file: path.into(),
            key: (*key).clone(),
        }
        .into());
    }
    // The hub's keys under this crate's names, the table padded; the ignored keys and those
    // of blocks the store does not hold (other pipeline stages') left out.
    let mut named = HashMap::new();
    for (key, value) in loaded.into_iter().filter(|(k, _)| !is_ignored(k)) {
        let name = with_prefix(&key);
        if store.id(&name).is_err() {
            continue;
        }
        let value = match name == TABLE && value.dim(0)? == config.vocab_size {
            true => pad_rows(&value, config.padded_vocab())?,
            false => value,
        };
        named.insert(name, value);
    }
    let entries = store.entries();
    load_tensors(store, path, &named, |id, full| {
        let value = part(id, full).map_err(|e| TensorError::Block {
            block: entries[id].name.clone(),
            message: e.to_string(),
        })?;
        Ok(value.to_dtype(entries[id].var.dtype())?)
    })?;
    Ok(())
}

/// Writes `store` (a GPT of `config`) to `path` atomically, as `GPT2LMHeadModel` names it.
pub fn save_hf_safetensors(store: &ParamStore, config: &GptConfig, path: &Path) -> Result<()> {
    let mut tensors = HashMap::new();
    for entry in store.entries() {
        let value = match entry.name == TABLE {
            true => entry.tensor().narrow(0, 0, config.vocab_size)?,
            false => entry.tensor().clone(),
        };
        tensors.insert(entry.name.clone(), value.contiguous()?);
    }
    Ok(save_tensors(&tensors, path)?)
}

fn with_prefix(key: &str) -> String {
    match key.starts_with("transformer.") {
        true => key.to_string(),
        false => format!("transformer.{key}"),
    }
}

/// `value` with zero rows appended up to `rows`.
fn pad_rows(value: &Tensor, rows: usize) -> Result<Tensor> {
    let padding = Tensor::zeros(
        (rows - value.dim(0)?, value.dim(1)?),
        value.dtype(),
        value.device(),
    )?;
    Ok(Tensor::cat(&[value, &padding], 0)?)
}
