//! One rank's part of a sharded checkpoint, taken in three steps so that writing needs no
//! communication: [`prepare_sharded`] gathers the rank's shard (and, on the group's first rank,
//! the model) to the host; [`ShardPart::write`] writes its files into the staging folder
//! `DIR.partial`, each flushed to the disk, on any thread; once every rank has written,
//! [`ShardPart::commit`] on the group's first rank writes the manifest and renames the folder
//! to `DIR` ([`weft_tensor::durable`]). The caller decides how the ranks wait for each other in
//! between (a barrier in [`super::checkpoint::save_sharded`]; a trainer polls under a save
//! timeout of its own).

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use weft_optim::FlatState;
use weft_tensor::{durable, ParamStore};

use super::checkpoint::{fail, partial, save_atomic, MASTER, MODEL_FILE, PARAMETERS};
use super::manifest::{Manifest, ManifestShard, FORMAT};
use super::ShardLayout;
use crate::error::Result;
use crate::Trainer;

/// A rank's files of a sharded checkpoint, on the host, and on the group's first rank the
/// manifest that completes it.
pub struct ShardPart {
    dir: PathBuf,
    staging: PathBuf,
    files: Vec<(PathBuf, HashMap<String, Tensor>)>,
    manifest: Option<Manifest>,
}

/// The name of rank `rank`'s shard file among `world`.
pub(super) fn shard_file(rank: usize, world: usize) -> String {
    format!("shard-{rank:05}-of-{world:05}.safetensors")
}

/// Gathers rank `rank` of `world`'s part of `trainer`'s checkpoint into `dir` to the host, and
/// creates the staging folder. `shards` are the cuts its optimizer steps (one shard of all for
/// one process).
pub fn prepare_sharded(
    trainer: &mut Trainer,
    (rank, world): (usize, usize),
    shards: &ShardLayout,
    dir: &Path,
) -> Result<ShardPart> {
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
    let mut tensors: HashMap<String, Tensor> = buffers
        .iter()
        .map(|(name, t)| Ok((name.clone(), t.to_device(&Device::Cpu)?)))
        .collect::<Result<_>>()?;
    let master = trainer.master_weights()?.cloned();
    let master_weights = master.is_some();
    if let Some(master) = master {
        tensors.insert(MASTER.into(), master.to_device(&Device::Cpu)?);
    }
    let parameter_shard = trainer.strategy().parameter_shard();
    if let Some(own) = parameter_shard {
        tensors.insert(PARAMETERS.into(), own.to_device(&Device::Cpu)?);
    }
    let mut files = vec![(staging.join(shard_file(rank, world)), tensors)];
    let mut manifest = None;
    if rank == 0 {
        let store = trainer.model().store();
        let model = host_tensors(store, parameter_shard.is_none())?;
        files.push((staging.join(MODEL_FILE), model));
        manifest = Some(Manifest {
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
        });
    }
    Ok(ShardPart {
        dir: dir.to_path_buf(),
        staging,
        files,
        manifest,
    })
}

/// The model's buffers, and its parameters when `with_parameters`, by name on the host.
fn host_tensors(store: &ParamStore, with_parameters: bool) -> Result<HashMap<String, Tensor>> {
    let ids = match with_parameters {
        true => (0..store.len()).collect(),
        false => store.buffer_ids(),
    };
    ids.into_iter()
        .map(|id| &store.entries()[id])
        .map(|e| Ok((e.name.clone(), e.tensor().to_device(&Device::Cpu)?)))
        .collect()
}

impl ShardPart {
    /// Writes this rank's files into the staging folder, each durably; no communication.
    pub fn write(&self) -> Result<()> {
        for (path, tensors) in &self.files {
            save_atomic(tensors, path)?;
        }
        Ok(())
    }

    /// On the group's first rank, once every rank has written: writes the manifest and renames
    /// the staging folder into place, durably. Nothing on the other ranks.
    pub fn commit(self) -> Result<()> {
        let Some(manifest) = self.manifest else {
            return Ok(());
        };
        let path = self.staging.join("manifest.json");
        let text = serde_json::to_string_pretty(&manifest).map_err(|e| fail(&path, e))?;
        durable::write(&path, text.as_bytes()).map_err(|e| fail(&path, e))?;
        durable::rename(&self.staging, &self.dir).map_err(|e| fail(&self.dir, e))
    }
}
