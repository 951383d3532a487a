//! Sharded checkpoints of a ZeRO run: every rank writes the optimizer state (and master
//! weights; under ZeRO-3 the parameters) of its shard to a file of its own, rank 0 the model
//! (under ZeRO-3 its buffers only) and the manifest
//! ([`super::manifest`]), and any number of ranks reads them back: each reads the parts of the
//! shard files that overlap its new range. One process reads the whole; [`super::full_state`]
//! converts to and from a full state dict by parameter name.
//!
//! Writing is atomic and durable ([`super::shard_part`]): the ranks write into `DIR.partial`,
//! each file flushed to the disk, and once all have written (a barrier), rank 0 writes the
//! manifest and renames the folder to `DIR`, flushing the folders; a folder without a manifest
//! is never read.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use candle_core::Tensor;
use weft_collectives::Communicator;
use weft_tensor::state_dict::{
    load_safetensors, load_safetensors_entries, read_flat_ranges, temporary_sibling,
};
use weft_tensor::{durable, FlatLayout, ParamStore};

use super::manifest::Manifest;
use super::shard_part::prepare_sharded;
use super::ShardLayout;
use crate::error::{ParallelError, Result};
use crate::Trainer;

pub(super) const MODEL_FILE: &str = "model.safetensors";
/// The name of the master weights in a shard file.
pub const MASTER: &str = "master_weights";
pub(super) const PARAMETERS: &str = "parameters";

pub(super) fn fail(path: &Path, e: impl std::fmt::Display) -> ParallelError {
    ParallelError::Checkpoint(format!("{}: {e}", path.display()))
}

pub(super) fn partial(dir: &Path) -> PathBuf {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dir.with_file_name(format!("{name}.partial"))
}

pub(super) fn save_atomic(tensors: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
    let tmp = temporary_sibling(path);
    candle_core::safetensors::save(tensors, &tmp).map_err(|e| fail(path, e))?;
    durable::rename(&tmp, path).map_err(|e| fail(path, e))
}

/// Writes `trainer`'s checkpoint to `dir` from every rank of `comm` (a collective: every rank
/// calls it). `shards` are the cuts its optimizer steps (one shard of all for one process).
pub fn save_sharded(
    trainer: &mut Trainer,
    comm: &dyn Communicator,
    shards: &ShardLayout,
    dir: &Path,
) -> Result<()> {
    let part = prepare_sharded(trainer, (comm.rank(), comm.world_size()), shards, dir)?;
    part.write()?;
    comm.barrier().wait()?;
    part.commit()?;
    comm.barrier().wait()?;
    Ok(())
}

/// The flat values of each of `names` over `range`, in order, read from the shard files that
/// overlap it: of each file only the elements in `range` (the file mapped, its header checked
/// against its length, each tensor against the shard's length).
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
        let within = start - shard.start..end - shard.start;
        let values = read_flat_ranges(&path, names, shard.end - shard.start, within)?;
        for (parts, values) in parts.iter_mut().zip(values) {
            parts.push(values);
        }
    }
    if range.is_empty() || parts.iter().any(Vec::is_empty) {
        return Err(fail(dir, format!("no shard holds elements {range:?}")));
    }
    let joined = parts
        .iter()
        .map(|p| Ok(Tensor::cat(p, 0)?))
        .collect::<Result<Vec<_>>>()?;
    match joined.iter().find(|t| t.elem_count() != range.len()) {
        Some(short) => Err(fail(
            dir,
            format!(
                "the shards hold {} of elements {range:?}",
                short.elem_count()
            ),
        )),
        None => Ok(joined),
    }
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
