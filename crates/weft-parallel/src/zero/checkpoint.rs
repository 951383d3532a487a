//! Sharded checkpoints of a ZeRO run: every rank writes the optimizer state (and master
//! weights; under ZeRO-3 the parameters) of its shard to a file of its own, rank 0 the model
//! (under ZeRO-3 its buffers only) and the manifest
//! ([`super::manifest`]), and any number of ranks reads them back: each reads the parts of the
//! shard files that overlap its new range. One process reads the whole; [`super::full_state`]
//! converts to and from a full state dict by parameter name.
//!
//! Writing is atomic: the ranks write into `DIR.partial`, and once all have written (a
//! barrier), rank 0 writes the manifest and renames the folder to `DIR`; a folder without a
//! manifest is never read.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use weft_collectives::Communicator;
use weft_optim::FlatState;
use weft_tensor::state_dict::{
    load_safetensors, load_safetensors_entries, save_safetensors, save_tensors, temporary_sibling,
};
use weft_tensor::{FlatLayout, ParamStore};

use super::manifest::{Manifest, ManifestShard, FORMAT};
use super::ShardLayout;
use crate::error::{ParallelError, Result};
use crate::Trainer;

const MODEL_FILE: &str = "model.safetensors";
/// The name of the master weights in a shard file.
pub const MASTER: &str = "master_weights";
pub(super) const PARAMETERS: &str = "parameters";

pub(super) fn fail(path: &Path, e: impl std::fmt::Display) -> ParallelError {
    ParallelError::Checkpoint(format!("{}: {e}", path.display()))
}

fn shard_file(rank: usize, world: usize) -> String {
    format!("shard-{rank:05}-of-{world:05}.safetensors")
}

fn partial(dir: &Path) -> PathBuf {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dir.with_file_name(format!("{name}.partial"))
}

pub(super) fn save_atomic(tensors: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
    let tmp = temporary_sibling(path);
    candle_core::safetensors::save(tensors, &tmp).map_err(|e| fail(path, e))?;
    std::fs::rename(&tmp, path).map_err(|e| fail(path, e))
}

/// Writes `trainer`'s checkpoint to `dir` from every rank of `comm` (a collective: every rank
/// calls it). `shards` are the cuts its optimizer steps (one shard of all for one process).
pub fn save_sharded(
    trainer: &mut Trainer,
    comm: &dyn Communicator,
    shards: &ShardLayout,
    dir: &Path,
) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    if dir.exists() {
        return Err(fail(dir, "the checkpoint folder exists already"));
    }
    let staging = partial(dir);
    weft_tensor::private_files::create_private_dir_all(&staging).map_err(|e| fail(&staging, e))?;
    let range = shards.range(rank);
    let FlatState {
        optimizer,
        step,
        buffers,
    } = trainer.optimizer()?.flat_state(range.len())?;
    let mut tensors: HashMap<String, Tensor> = buffers.iter().cloned().collect();
    let master = trainer.master_weights()?.cloned();
    let master_weights = master.is_some();
    if let Some(master) = master {
        tensors.insert(MASTER.into(), master.to_device(&Device::Cpu)?);
    }
    let parameter_shard = trainer.strategy().parameter_shard();
    if let Some(own) = parameter_shard {
        tensors.insert(PARAMETERS.into(), own.to_device(&Device::Cpu)?);
    }
    save_atomic(&tensors, &staging.join(shard_file(rank, world)))?;
    if rank == 0 {
        let store = trainer.model().store();
        let model = staging.join(MODEL_FILE);
        match parameter_shard {
            Some(_) => save_buffers(store, &model)?,
            None => save_safetensors(store, &model)?,
        }
    }
    comm.barrier().wait()?;
    if rank == 0 {
        let manifest = Manifest {
            format: FORMAT.into(),
            optimizer,
            step,
            buffers: buffers.into_iter().map(|(name, _)| name).collect(),
            master_weights,
            flat_len: shards.len(),
            entries: Manifest::entries_of(trainer.grads().layout()),
            shards: (0..world)
                .map(|r| {
                    let Range { start, end } = shards.range(r);
                    ManifestShard {
                        file: shard_file(r, world),
                        start,
                        end,
                    }
                })
                .collect(),
            model_file: MODEL_FILE.into(),
            parameters_in_shards: parameter_shard.is_some(),
        };
        let path = staging.join("manifest.json");
        let text = serde_json::to_string_pretty(&manifest).map_err(|e| fail(&path, e))?;
        let tmp = temporary_sibling(&path);
        std::fs::write(&tmp, text).map_err(|e| fail(&path, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| fail(&path, e))?;
        std::fs::rename(&staging, dir).map_err(|e| fail(dir, e))?;
    }
    comm.barrier().wait()?;
    Ok(())
}

/// The flat values of each of `names` over `range`, in order, read from the shard files that
/// overlap it (each file loaded once).
pub fn read_ranges(
    dir: &Path,
    manifest: &Manifest,
    names: &[String],
    range: &Range<usize>,
) -> Result<Vec<Tensor>> {
    let mut parts: Vec<Vec<Tensor>> = vec![Vec::new(); names.len()];
    for shard in &manifest.shards {
        let (start, end) = (shard.start.max(range.start), shard.end.min(range.end));
        if start >= end {
            continue;
        }
        let path = dir.join(&shard.file);
        let mut tensors =
            candle_core::safetensors::load(&path, &Device::Cpu).map_err(|e| fail(&path, e))?;
        for (name, parts) in names.iter().zip(&mut parts) {
            let values = tensors
                .remove(name)
                .ok_or_else(|| fail(&path, format!("no tensor {name:?}")))?;
            if values.elem_count() != shard.end - shard.start {
                let (has, holds) = (values.elem_count(), shard.end - shard.start);
                return Err(fail(
                    &path,
                    format!("{name} has {has} elements, the shard {holds}"),
                ));
            }
            parts.push(values.narrow(0, start - shard.start, end - start)?);
        }
    }
    if range.is_empty() || parts.iter().any(Vec::is_empty) {
        return Err(fail(dir, format!("no shard holds elements {range:?}")));
    }
    parts.iter().map(|p| Ok(Tensor::cat(p, 0)?)).collect()
}

/// Writes the buffers of `store` (not its parameters) to `path`, atomically.
fn save_buffers(store: &ParamStore, path: &Path) -> Result<()> {
    let tensors: HashMap<String, Tensor> = store
        .buffer_ids()
        .into_iter()
        .map(|id| &store.entries()[id])
        .map(|e| (e.name.clone(), e.tensor().clone()))
        .collect();
    Ok(save_tensors(&tensors, path)?)
}

/// Writes the model of the checkpoint in `dir` into `store`, whole: from its model file, or,
/// when the parameters are in the shards, its buffers from there and its parameters from the
/// shard files.
fn load_model(dir: &Path, manifest: &Manifest, store: &ParamStore) -> Result<()> {
    let model = dir.join(&manifest.model_file);
    if !manifest.parameters_in_shards {
        return Ok(load_safetensors(store, &model)?);
    }
    load_safetensors_entries(store, &model, &store.buffer_ids())?;
    let whole = 0..manifest.flat_len;
    let names = [PARAMETERS.to_string()];
    let [parameters] = <[Tensor; 1]>::try_from(read_ranges(dir, manifest, &names, &whole)?)
        .map_err(|_| fail(dir, "one flat tensor of parameters"))?;
    Ok(FlatLayout::parameters(store).write_range(store, 0, &parameters)?)
}

/// Loads the checkpoint in `dir` into `trainer`, on every rank of `comm` (any number of ranks:
/// each reads its range of `shards` from the files that hold it): the model whole (a ZeRO-3
/// trainer keeps its shard of it), the optimizer state and master weights of this rank's range.
pub fn load_sharded(
    trainer: &mut Trainer,
    comm: &dyn Communicator,
    shards: &ShardLayout,
    dir: &Path,
) -> Result<()> {
    let manifest = Manifest::read(dir)?;
    manifest.check_layout(trainer.grads().layout(), dir)?;
    // Every shard file is read (and its ranges checked) before anything is written.
    let range = shards.range(comm.rank());
    // A fresh trainer makes its master copy at its first step: load it now all the same (it
    // differs from the model's values in mixed precision, and is one update ahead of them
    // under the delayed update).
    let load_master = manifest.master_weights && trainer.keeps_master_copy();
    let mut names = manifest.buffers.clone();
    if load_master {
        names.push(MASTER.into());
    }
    let mut values = match range.is_empty() {
        true => Vec::new(),
        false => read_ranges(dir, &manifest, &names, &range)?,
    };
    trainer.with_full_parameters(|model| load_model(dir, &manifest, model.store()))?;
    if range.is_empty() {
        return Ok(());
    }
    let master = load_master.then(|| values.pop()).flatten();
    let buffers = names.into_iter().zip(values).collect();
    trainer.optimizer_mut()?.load_flat_state(
        &manifest.optimizer,
        manifest.step,
        range.clone(),
        buffers,
    )?;
    match master {
        Some(master) => trainer.load_master_weights(&master),
        // Without saved master weights the copy is the model's values, read above.
        None => trainer.reload_master_weights(),
    }
}
