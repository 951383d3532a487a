//! Hugging Face Llama and Phi-3 checkpoints: loading one into a Llama-family model (a
//! safetensors file or a `save_pretrained` folder, sharded or not; the rotary-frequency buffers
//! older exports carry, and a tied model's `lm_head.weight`, are skipped) and exporting a model
//! as a folder `from_pretrained` loads as it is (`config.json` beside the weights).

use std::path::{Path, PathBuf};

use candle_core::{DType, Tensor};
use weft_tensor::hf_checkpoint::{load_weights, save_weights};
use weft_tensor::state_dict::load_tensors;
use weft_tensor::{EntryId, ParamStore, TensorError};

use super::config::LlamaConfig;
use crate::error::Result;

/// Shards of an export hold at most this many bytes (`save_pretrained`'s former default).
pub const MAX_SHARD_BYTES: usize = 5_000_000_000;

/// Keys a checkpoint may hold that are not this model's parameters: the rotary frequencies
/// older `transformers` versions saved, and the head of a model whose head is the table.
fn is_ignored(key: &str, config: &LlamaConfig) -> bool {
    key.ends_with("rotary_emb.inv_freq") || (config.tie_word_embeddings && key == "lm_head.weight")
}

/// Loads the checkpoint at `path` (a file or a folder; see
/// [`weft_tensor::hf_checkpoint::load_weights`]) into `store`, a Llama-family model of `config`:
/// every parameter must be there with its shape, and every key must be a parameter; values
/// are converted to the store's dtype. Errors name the file and the key.
pub fn load_hf(store: &ParamStore, config: &LlamaConfig, path: &Path) -> Result<()> {
    load_hf_sliced(store, config, path, |_, full| Ok(full.clone()))
}

/// [`load_hf`] into a store holding parts of the parameters (a tensor-parallel rank's):
/// `part(id, full)` gives entry `id`'s part of the full value, which must then have the
/// entry's shape.
pub fn load_hf_sliced(
    store: &ParamStore,
    config: &LlamaConfig,
    path: &Path,
    part: impl Fn(EntryId, &Tensor) -> weft_tensor::Result<Tensor>,
) -> Result<()> {
    let mut loaded = load_weights(path, store.device())?;
    loaded.retain(|key, _| !is_ignored(key, config));
    let file = weights_file(path);
    let entries = store.entries();
    load_tensors(store, &file, &loaded, |id, value| {
        Ok(part(id, value)?.to_dtype(entries[id].var.dtype())?)
    })?;
    Ok(())
}

/// The file a loading error names: the file itself, or the folder's weights.
fn weights_file(path: &Path) -> PathBuf {
    use weft_tensor::hf_checkpoint::{INDEX, WEIGHTS};
    match path.is_dir() {
        true if path.join(INDEX).is_file() => path.join(INDEX),
        true => path.join(WEIGHTS),
        false => path.into(),
    }
}

/// Writes `store` (a Llama-family model of `config`) into the folder `dir`: `config.json` and
/// the weights in the store's dtype (`model.safetensors`, or shards of at most
/// [`MAX_SHARD_BYTES`] with their index). Returns the weights' files.
pub fn save_hf(store: &ParamStore, config: &LlamaConfig, dir: &Path) -> Result<Vec<PathBuf>> {
    let tensors: Vec<_> = store
        .entries()
        .iter()
        .map(|e| Ok((e.name.clone(), e.tensor().contiguous()?)))
        .collect::<Result<_>>()?;
    let written = save_weights(&tensors, dir, MAX_SHARD_BYTES)?;
    let json = config.to_hf_json(dtype_name(store.dtype()));
    let path = dir.join("config.json");
    let text = serde_json::to_vec_pretty(&json).expect("a config serialises");
    weft_tensor::durable::write(&path, &text)
        .map_err(|source| TensorError::Io { file: path, source })?;
    Ok(written)
}

/// PyTorch's name of `dtype`.
fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        DType::F64 => "float64",
        _ => "float32",
    }
}
