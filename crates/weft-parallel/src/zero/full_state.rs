//! The full state dict of a sharded checkpoint: the optimizer's state and master weights by
//! parameter name (`<buffer>/<parameter>`, each shaped like its parameter; the optimizer's name
//! and step in the safetensors metadata), as one process holds them — written from the shard
//! files ([`export_full_state`]) and read into any rank's shard ([`import_full_state`]).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use weft_tensor::state_dict::{load_safetensors, temporary_sibling};

use super::checkpoint::{fail, read_ranges, save_atomic, MASTER, PARAMETERS};
use super::manifest::Manifest;
use super::ShardLayout;
use crate::error::Result;
use crate::Trainer;

/// The format of a full state dict's metadata.
const FULL_FORMAT: &str = "weft-full-state-v1";

/// Writes the optimizer state and master weights of the checkpoint in `dir` by parameter name
/// into one safetensors file (`<buffer>/<parameter>`, each shaped like its parameter, with the
/// optimizer's name and step in the file's metadata): the full state dict, as one process holds
/// it. The model's parameters are `dir/model.safetensors`, or, from a ZeRO-3 run, written
/// whole by [`export_full_model`].
pub fn export_full_state(dir: &Path, out: &Path) -> Result<()> {
    let manifest = Manifest::read(dir)?;
    let whole = 0..manifest.flat_len;
    let mut names: Vec<String> = manifest.buffers.clone();
    if manifest.master_weights {
        names.push(MASTER.into());
    }
    let mut tensors = Vec::new();
    for (name, flat) in names
        .iter()
        .zip(read_ranges(dir, &manifest, &names, &whole)?)
    {
        for entry in &manifest.entries {
            let numel: usize = entry.shape.iter().product();
            let values = flat
                .narrow(0, entry.offset, numel)?
                .reshape(entry.shape.as_slice())?;
            tensors.push((format!("{name}/{}", entry.name), values));
        }
    }
    let metadata = HashMap::from([
        ("format".to_string(), FULL_FORMAT.to_string()),
        ("optimizer".to_string(), manifest.optimizer.clone()),
        ("step".to_string(), manifest.step.to_string()),
        ("buffers".to_string(), manifest.buffers.join(",")),
        (
            "master_weights".to_string(),
            manifest.master_weights.to_string(),
        ),
    ]);
    let tmp = temporary_sibling(out);
    safetensors::serialize_to_file(tensors, Some(metadata), &tmp).map_err(|e| fail(out, e))?;
    weft_tensor::durable::rename(&tmp, out).map_err(|e| fail(out, e))
}

/// Writes the whole model of the checkpoint in `dir` to `out` as one safetensors file by
/// parameter name (PyTorch's `state_dict` names): its model file, with the parameters from the
/// shard files where a ZeRO-3 run kept them there.
pub fn export_full_model(dir: &Path, out: &Path) -> Result<()> {
    let manifest = Manifest::read(dir)?;
    let model = dir.join(&manifest.model_file);
    let mut tensors =
        candle_core::safetensors::load(&model, &Device::Cpu).map_err(|e| fail(&model, e))?;
    if manifest.parameters_in_shards {
        let whole = 0..manifest.flat_len;
        let flat = read_ranges(dir, &manifest, &[PARAMETERS.to_string()], &whole)?;
        for entry in &manifest.entries {
            let numel: usize = entry.shape.iter().product();
            let values = flat[0]
                .narrow(0, entry.offset, numel)?
                .reshape(entry.shape.as_slice())?;
            tensors.insert(entry.name.clone(), values);
        }
    }
    save_atomic(&tensors, out)
}

/// Loads a full state dict (`model` as [`weft_tensor::state_dict::save_safetensors`] or
/// [`export_full_model`] write it, `state` as [`export_full_state`] does) into `trainer`: this
/// rank's range of `shards` of every buffer.
pub fn import_full_state(
    trainer: &mut Trainer,
    rank: usize,
    shards: &ShardLayout,
    (model, state): (&Path, &Path),
) -> Result<()> {
    trainer.with_full_parameters(|m| Ok(load_safetensors(m.store(), model)?))?;
    let bytes = std::fs::read(state).map_err(|e| fail(state, e))?;
    let (_, header) =
        safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| fail(state, e))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let field = |key: &str| {
        meta.get(key)
            .cloned()
            .ok_or_else(|| fail(state, format!("metadata has no {key:?}")))
    };
    if field("format")? != FULL_FORMAT {
        return Err(fail(state, format!("not a {FULL_FORMAT} file")));
    }
    let step: u64 = field("step")?.parse().map_err(|e| fail(state, e))?;
    let buffers: Vec<String> = field("buffers")?
        .split(',')
        .filter(|b| !b.is_empty())
        .map(String::from)
        .collect();
    let tensors =
        candle_core::safetensors::load(state, &Device::Cpu).map_err(|e| fail(state, e))?;
    let range = shards.range(rank);
    let keeps_master = trainer.master_weights()?.is_some();
    let layout = trainer.grads().layout().clone();
    let slice = |name: &str| -> Result<Tensor> {
        let mut parts = Vec::new();
        for slot in layout.slots() {
            let (start, end) = (
                slot.offset.max(range.start),
                (slot.offset + slot.numel()).min(range.end),
            );
            if start >= end {
                continue;
            }
            let key = format!("{name}/{}", slot.name);
            let values = tensors
                .get(&key)
                .ok_or_else(|| fail(state, format!("no tensor {key:?}")))?;
            if values.dims() != slot.shape.as_slice() {
                return Err(fail(
                    state,
                    format!(
                        "{key} is {:?}, the parameter {:?}",
                        values.dims(),
                        slot.shape
                    ),
                ));
            }
            parts.push(
                values
                    .flatten_all()?
                    .narrow(0, start - slot.offset, end - start)?,
            );
        }
        Ok(Tensor::cat(&parts, 0)?)
    };
    if range.is_empty() {
        return Ok(());
    }
    let flat = buffers
        .iter()
        .map(|b| Ok((b.clone(), slice(b)?)))
        .collect::<Result<Vec<_>>>()?;
    let master = match field("master_weights")? == "true" && keeps_master {
        true => Some(slice(MASTER)?),
        false => None,
    };
    let optimizer = field("optimizer")?;
    trainer
        .optimizer_mut()?
        .load_flat_state(&optimizer, step, range, flat)?;
    match master {
        Some(values) => trainer.load_master_weights(&values),
        None => trainer.reload_master_weights(),
    }
}
