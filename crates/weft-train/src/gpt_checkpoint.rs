//! Checkpoints of a tensor-parallel GPT run. Each tensor-parallel rank's slices are a sharded
//! checkpoint in ZeRO's format (`weft-sharded-v1`: the slices of the model, and the optimizer's
//! state and master weights over the data-parallel shards) in `DIR/tp-RRRRR-of-KKKKK/`, written
//! by the replicas holding those slices; `DIR/tensor-parallel.json` says how each entry is cut.
//! Under ZeRO every replica writes its shard; under plain data parallelism (every replica holds
//! the whole state of its slices) the first replica writes it alone, and each replica reads it
//! whole. Writing is atomic: the ranks write into `DIR.partial`, renamed to `DIR` once all have
//! written. [`export_full_model`] joins the slices into the whole model's state dict by name, in
//! one process with no communication.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use weft_parallel::zero::checkpoint::load_sharded;
use weft_parallel::zero::shard_part::{prepare_sharded, ShardPart};
use weft_parallel::zero::ShardLayout;
use weft_parallel::Trainer;
use weft_tensor::EntryId;

use crate::gpt_parallel::GptMesh;
use crate::run_dir::write_atomically;
use crate::tp_split::Split;

const FORMAT: &str = "weft-tensor-parallel-v1";
const MANIFEST: &str = "tensor-parallel.json";

/// `DIR/tensor-parallel.json`.
#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    format: String,
    /// Ranks per tensor-parallel group.
    size: usize,
    /// Each split entry by name; the others are whole on every rank.
    splits: Vec<(String, Split)>,
}

pub(crate) fn rank_dir(dir: &Path, rank: usize, size: usize) -> PathBuf {
    dir.join(format!("tp-{rank:05}-of-{size:05}"))
}

fn partial(dir: &Path) -> PathBuf {
    let mut name = dir.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// How this rank takes part: the group it writes or reads with, the shards of the flat
/// buffers (of `len` values) over that group, and whether it writes.
pub(crate) fn role<'a>(
    mesh: &'a GptMesh,
    zero_shards: Option<&ShardLayout>,
    len: usize,
) -> Result<(&'a dyn weft_collectives::Communicator, ShardLayout, bool)> {
    let (Some(replicas), Some(solo)) = (&mesh.replicas, &mesh.solo) else {
        bail!("a tensor-parallel checkpoint needs a job of several ranks");
    };
    Ok(match zero_shards {
        Some(shards) => (replicas.as_ref(), shards.clone(), true),
        None => (solo.as_ref(), ShardLayout::new(len, 1), mesh.dp_rank == 0),
    })
}

/// A rank's part of a tensor-parallel checkpoint, on the host: its group's sharded
/// sub-checkpoint (when it writes one) in `DIR.partial/tp-RRRRR-of-SSSSS`, and on the stage's
/// leader the manifest that completes `DIR`. Written by [`Self::write`] without communication;
/// committed in two rounds once every rank has written: [`Self::commit_shards`] renames the
/// sub-checkpoints into place, then (after a barrier) [`Self::commit`] on the leader writes the
/// manifest and renames the folder.
pub struct TensorParallelPart {
    shard: Option<ShardPart>,
    leader: Option<(PathBuf, PathBuf, Manifest)>,
}

/// Gathers this rank's part of `trainer`'s checkpoint into `dir` (its model's slices as
/// `splits` cut them, its optimizer state over `zero_shards` under ZeRO, or whole) to the host.
pub fn prepare_tensor_parallel(
    trainer: &mut Trainer,
    mesh: &GptMesh,
    splits: &[(EntryId, Split)],
    zero_shards: Option<&ShardLayout>,
    dir: &Path,
) -> Result<TensorParallelPart> {
    let Some(group) = &mesh.tp else {
        bail!(
            "{}: a tensor-parallel checkpoint needs --tp of 2 or more",
            dir.display()
        );
    };
    if dir.exists() {
        bail!("{}: the checkpoint folder exists already", dir.display());
    }
    let staging = partial(dir);
    let len = trainer.grads().layout().len();
    let (comm, shards, writes) = role(mesh, zero_shards, len)?;
    let shard = match writes {
        true => {
            let own = rank_dir(&staging, group.rank(), group.size());
            let at = (comm.rank(), comm.world_size());
            Some(prepare_sharded(trainer, at, &shards, &own)?)
        }
        false => None,
    };
    // The first rank of the stage (of its first replica's group) completes it.
    let leader = (mesh.dp_rank == 0 && group.rank() == 0).then(|| {
        let entries = trainer.model().store().entries();
        let manifest = Manifest {
            format: FORMAT.into(),
            size: group.size(),
            splits: splits
                .iter()
                .map(|(id, split)| (entries[*id].name.clone(), split.clone()))
                .collect(),
        };
        (staging, dir.to_path_buf(), manifest)
    });
    Ok(TensorParallelPart { shard, leader })
}

impl TensorParallelPart {
    /// Writes this rank's files, durably; no communication.
    pub fn write(&self) -> Result<()> {
        if let Some(shard) = &self.shard {
            shard.write()?;
        }
        Ok(())
    }

    /// Once every rank has written: renames this rank's sub-checkpoint into place (on its
    /// group's first rank).
    pub fn commit_shards(&mut self) -> Result<()> {
        if let Some(shard) = self.shard.take() {
            shard.commit()?;
        }
        Ok(())
    }

    /// Once every sub-checkpoint is in place: on the leader, writes the manifest and renames the
    /// checkpoint into place, durably.
    pub fn commit(self) -> Result<()> {
        let Some((staging, dir, manifest)) = self.leader else {
            return Ok(());
        };
        write_atomically(
            &staging.join(MANIFEST),
            &serde_json::to_vec_pretty(&manifest)?,
        )?;
        weft_tensor::durable::rename(&staging, &dir)
            .with_context(|| format!("{}: cannot rename into place", dir.display()))
    }
}

/// Writes `trainer`'s checkpoint to `dir` from every rank of `mesh` (a collective): its model's
/// slices as `splits` cut them, its optimizer state over `zero_shards` (ZeRO) or whole.
pub fn save_tensor_parallel(
    trainer: &mut Trainer,
    mesh: &GptMesh,
    splits: &[(EntryId, Split)],
    zero_shards: Option<&ShardLayout>,
    dir: &Path,
) -> Result<()> {
    let Some(world) = &mesh.world else {
        bail!(
            "{}: a tensor-parallel checkpoint needs --tp of 2 or more",
            dir.display()
        );
    };
    let mut part = prepare_tensor_parallel(trainer, mesh, splits, zero_shards, dir)?;
    part.write()?;
    world.barrier().wait()?;
    part.commit_shards()?;
    world.barrier().wait()?;
    part.commit()?;
    world.barrier().wait()?;
    Ok(())
}

/// The tensor-parallel size checkpoint `dir` was written with, if it is in this format.
pub fn written_tp_size(dir: &Path) -> Result<Option<usize>> {
    match dir.join(MANIFEST).is_file() {
        true => Ok(Some(read_manifest(dir)?.size)),
        false => Ok(None),
    }
}

fn read_manifest(dir: &Path) -> Result<Manifest> {
    let path = dir.join(MANIFEST);
    let text = std::fs::read(&path).with_context(|| format!("{}: cannot read", path.display()))?;
    let manifest: Manifest = serde_json::from_slice(&text)
        .with_context(|| format!("{}: not a tensor-parallel manifest", path.display()))?;
    if manifest.format != FORMAT {
        bail!(
            "{}: format {:?}, expected {FORMAT}",
            path.display(),
            manifest.format
        );
    }
    if manifest.size == 0 {
        bail!("{}: field size: 0 ranks", path.display());
    }
    let no_groups = manifest
        .splits
        .iter()
        .find(|(_, split)| *split == Split::Columns { groups: 0 });
    if let Some((name, _)) = no_groups {
        bail!("{}: field splits ({name}): 0 column groups", path.display());
    }
    Ok(manifest)
}

/// Loads the checkpoint in `dir` into `trainer` (built with the same tensor-parallel size; any
/// number of replicas under ZeRO, as ZeRO's own checkpoints).
pub fn load_tensor_parallel(
    trainer: &mut Trainer,
    mesh: &GptMesh,
    zero_shards: Option<&ShardLayout>,
    dir: &Path,
) -> Result<()> {
    let Some(group) = &mesh.tp else {
        bail!(
            "{}: a tensor-parallel checkpoint needs --tp of 2 or more",
            dir.display()
        );
    };
    let manifest = read_manifest(dir)?;
    if manifest.size != group.size() {
        bail!(
            "{}: written by groups of {} ranks, loaded by groups of {} (--tp)",
            dir.display(),
            manifest.size,
            group.size()
        );
    }
    let len = trainer.grads().layout().len();
    let (comm, shards, _) = role(mesh, zero_shards, len)?;
    load_sharded(
        trainer,
        comm,
        &shards,
        &rank_dir(dir, group.rank(), group.size()),
    )?;
    Ok(())
}

/// The whole model's state dict (weft's names and the padded table) from the slices in `dir`.
pub fn export_full_model(dir: &Path) -> Result<HashMap<String, Tensor>> {
    let manifest = read_manifest(dir)?;
    let parts: Vec<HashMap<String, Tensor>> = (0..manifest.size)
        .map(|r| {
            let path = rank_dir(dir, r, manifest.size).join("model.safetensors");
            candle_core::safetensors::load(&path, &Device::Cpu)
                .with_context(|| format!("{}: cannot read", path.display()))
        })
        .collect::<Result<_>>()?;
    join_slices(dir, &parts)
}

/// The ranks' `parts` (each a map from weft's names to that rank's slices) joined by name into
/// whole tensors, as checkpoint `dir`'s manifest says each entry was cut.
pub(crate) fn join_slices(
    dir: &Path,
    parts: &[HashMap<String, Tensor>],
) -> Result<HashMap<String, Tensor>> {
    let manifest = read_manifest(dir)?;
    let mut full = HashMap::new();
    let Some(first_part) = parts.first() else {
        return Ok(full);
    };
    for (name, first) in first_part {
        let slices = parts
            .iter()
            .map(|p| p.get(name).cloned())
            .collect::<Option<Vec<_>>>()
            .with_context(|| format!("{}: a rank's slices lack {name}", dir.display()))?;
        let split = manifest.splits.iter().find(|(n, _)| n == name);
        let whole = match split {
            None => first.clone(),
            Some((_, split)) => {
                let side_by_side = Tensor::cat(&slices, split.dim(first.rank()))?;
                split.join(&side_by_side, manifest.size)?
            }
        };
        full.insert(name.clone(), whole);
    }
    Ok(full)
}
