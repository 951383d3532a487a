//! A tensor-parallel or pipelined checkpoint resumed by a run without that parallelism (one
//! process, or replicas under DDP or ZeRO): the parts' model, optimizer buffers and master
//! weights are joined by name into the whole model's — tensor-parallel slices as
//! [`crate::gpt_checkpoint::export_full_model`] joins them, pipeline stages side by side (a name
//! held by an earlier stage, the last stage's copy of the tied token table, is that stage's) —
//! then laid out in the run's flat buffers, of which each rank loads its range.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::Tensor;
use weft_parallel::zero::checkpoint::{read_ranges, MASTER};
use weft_parallel::zero::manifest::Manifest;
use weft_parallel::zero::ShardLayout;
use weft_parallel::Trainer;
use weft_tensor::state_dict::load_tensors;
use weft_tensor::FlatLayout;

use crate::gpt_checkpoint::{export_full_model, join_slices, rank_dir};
use crate::run_checkpoints::Stage;

/// How a checkpoint's parts make the whole model.
#[derive(Clone, Copy, Debug)]
pub enum Parts {
    /// Slices of every entry over a tensor-parallel group of `size` ranks.
    TensorParallel { size: usize },
    /// The blocks of `count` pipeline stages.
    Stages { count: usize },
}

impl Parts {
    /// Each part's sharded checkpoint folder inside `dir`.
    fn dirs(self, dir: &Path) -> Vec<PathBuf> {
        match self {
            Parts::TensorParallel { size } => (0..size).map(|r| rank_dir(dir, r, size)).collect(),
            Parts::Stages { count } => (0..count)
                .map(|index| Stage { index, count }.part(dir))
                .collect(),
        }
    }

    /// The whole model's tensors by name from the parts' `pieces`.
    fn join(
        self,
        dir: &Path,
        pieces: &[HashMap<String, Tensor>],
    ) -> Result<HashMap<String, Tensor>> {
        match self {
            Parts::TensorParallel { .. } => join_slices(dir, pieces),
            Parts::Stages { .. } => {
                let mut whole = HashMap::new();
                for piece in pieces {
                    for (name, t) in piece {
                        whole.entry(name.clone()).or_insert_with(|| t.clone());
                    }
                }
                Ok(whole)
            }
        }
    }

    /// The whole model's parameters and buffers by name.
    fn model(self, dir: &Path) -> Result<HashMap<String, Tensor>> {
        match self {
            Parts::TensorParallel { .. } => export_full_model(dir),
            Parts::Stages { .. } => {
                let pieces = self
                    .dirs(dir)
                    .iter()
                    .map(|d| {
                        let path = d.join("model.safetensors");
                        candle_core::safetensors::load(&path, &candle_core::Device::Cpu)
                            .with_context(|| format!("{}: cannot read", path.display()))
                    })
                    .collect::<Result<Vec<_>>>()?;
                self.join(dir, &pieces)
            }
        }
    }
}

/// Loads checkpoint `dir`, cut in `parts`, into `trainer`, built whole: the whole model, and
/// this rank's range of `shards` of the optimizer state and master weights.
pub fn load_joined(
    trainer: &mut Trainer,
    (shards, rank): (&ShardLayout, usize),
    dir: &Path,
    parts: Parts,
) -> Result<()> {
    let model = parts.model(dir)?;
    let layout = trainer.grads().layout().clone();
    // Every file is read and joined before anything is written.
    let state = joined_state(dir, parts, &layout)?;
    trainer.with_full_parameters(|m| {
        Ok(load_tensors(m.store(), dir, &model, |_, v| Ok(v.clone()))?)
    })?;
    let range = shards.range(rank);
    if range.is_empty() {
        return Ok(());
    }
    let part = |t: &Tensor| t.narrow(0, range.start, range.len());
    let buffers = state
        .buffers
        .iter()
        .map(|(name, flat)| Ok((name.clone(), part(flat)?)))
        .collect::<Result<Vec<_>>>()?;
    let (optimizer, step) = (state.optimizer.as_str(), state.step);
    trainer
        .optimizer_mut()?
        .load_flat_state(optimizer, step, range.clone(), buffers)?;
    match (&state.master, trainer.keeps_master_copy()) {
        (Some(master), true) => trainer.load_master_weights(&part(master)?)?,
        _ => trainer.reload_master_weights()?,
    }
    Ok(())
}

/// One rank's slices of each flat buffer, by buffer name, then parameter name.
type SlicesByBuffer = HashMap<String, HashMap<String, Tensor>>;

/// The optimizer state of a checkpoint's parts joined into the whole model's flat buffers laid
/// out as `layout`.
struct JoinedState {
    optimizer: String,
    step: u64,
    /// Each state buffer (`exp_avg`, …), flat over the whole model.
    buffers: Vec<(String, Tensor)>,
    master: Option<Tensor>,
}

fn joined_state(dir: &Path, parts: Parts, layout: &FlatLayout) -> Result<JoinedState> {
    // Per part: its manifest and, per flat buffer, its tensors by parameter name.
    let mut ranks: Vec<(Manifest, SlicesByBuffer)> = Vec::new();
    for own in parts.dirs(dir) {
        let manifest = Manifest::read(&own)?;
        let mut names = manifest.buffers.clone();
        if manifest.master_weights {
            names.push(MASTER.into());
        }
        let flats = read_ranges(&own, &manifest, &names, &(0..manifest.flat_len))?;
        let mut by_buffer = HashMap::new();
        for (name, flat) in names.into_iter().zip(flats) {
            let slices = manifest
                .entries
                .iter()
                .map(|e| {
                    let numel = e.shape.iter().product();
                    let slice = flat.narrow(0, e.offset, numel)?.reshape(e.shape.clone())?;
                    Ok((e.name.clone(), slice))
                })
                .collect::<Result<HashMap<_, _>>>()?;
            by_buffer.insert(name, slices);
        }
        ranks.push((manifest, by_buffer));
    }
    let (first, _) = &ranks[0];
    if let Some((other, _)) = ranks
        .iter()
        .find(|(m, _)| m.optimizer != first.optimizer || m.step != first.step)
    {
        bail!(
            "{}: the parts disagree: optimizer {} at step {} and {} at step {}",
            dir.display(),
            first.optimizer,
            first.step,
            other.optimizer,
            other.step
        );
    }
    let flat = |buffer: &str| -> Result<Tensor> {
        let found = ranks
            .iter()
            .map(|(_, b)| {
                b.get(buffer)
                    .cloned()
                    .with_context(|| format!("{}: a part lacks {buffer}", dir.display()))
            })
            .collect::<Result<Vec<_>>>()?;
        let whole = parts.join(dir, &found)?;
        let pieces = layout
            .slots()
            .iter()
            .map(|slot| {
                let t = whole
                    .get(&slot.name)
                    .with_context(|| format!("{}: {buffer} has no {}", dir.display(), slot.name))?;
                if t.dims() != slot.shape.as_slice() {
                    bail!(
                        "{}: {buffer} of {} is {:?}, the model's is {:?}",
                        dir.display(),
                        slot.name,
                        t.dims(),
                        slot.shape
                    );
                }
                Ok(t.flatten_all()?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Tensor::cat(&pieces, 0)?)
    };
    let buffers = first
        .buffers
        .iter()
        .map(|name| Ok((name.clone(), flat(name)?)))
        .collect::<Result<Vec<_>>>()?;
    let master = match first.master_weights {
        true => Some(flat(MASTER)?),
        false => None,
    };
    Ok(JoinedState {
        optimizer: first.optimizer.clone(),
        step: first.step,
        buffers,
        master,
    })
}
