//! Saving and resuming a trainer's state in [`crate::run_checkpoints`]'s folders, in every
//! layout: ZeRO's sharded format, written by every replica under ZeRO (each its shard) and by the
//! first replica alone under plain data parallelism (every replica holds the whole state), read
//! back by any number of replicas; the tensor-parallel format of [`crate::gpt_checkpoint`] under
//! `--tp`; under `--pp` each stage's part in a folder of its own. A tensor-parallel or pipelined
//! checkpoint also resumes without that parallelism (`gpt_checkpoint_join.rs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Result};
use weft_collectives::{Communicator, ShmCommunicator};
use weft_parallel::zero::checkpoint::{load_sharded, save_sharded};
use weft_parallel::zero::ShardLayout;
use weft_parallel::Trainer;
use weft_tensor::EntryId;

use crate::distributed::RankContext;
use crate::gpt_checkpoint::{self, load_tensor_parallel, save_tensor_parallel};
use crate::gpt_checkpoint_join::{load_joined, Parts};
use crate::gpt_parallel::{GptMesh, Split};
use crate::run_checkpoints::{self, Progress, Stage};
use crate::run_dir::RunFolder;

/// How a trainer's state is cut over the job's ranks.
pub enum Layout<'a> {
    /// One model per replica: `zero` the replicas' group and the shards of the optimizer state
    /// under ZeRO; `solo` a group of this rank alone (under plain data parallelism the first
    /// replica writes through it, and every replica reads the whole through its own).
    Replicated {
        zero: Option<(Arc<dyn Communicator>, ShardLayout)>,
        solo: Option<Arc<dyn Communicator>>,
        first_replica: bool,
    },
    /// A GPT split over tensor-parallel groups.
    TensorParallel {
        mesh: &'a GptMesh,
        splits: Vec<(EntryId, Split)>,
        zero_shards: Option<ShardLayout>,
    },
}

/// The group a rank writes or reads the sharded format with.
enum Group {
    Job(Arc<dyn Communicator>),
    /// A group of one for a process without a job.
    Alone(Box<ShmCommunicator>),
}

impl Group {
    fn comm(&self) -> &dyn Communicator {
        match self {
            Group::Job(comm) => comm.as_ref(),
            Group::Alone(comm) => comm.as_ref(),
        }
    }
}

/// What this rank does for a checkpoint.
enum Role<'l> {
    /// Writes (when `writes`) or reads the sharded format through `group`.
    Sharded {
        group: Group,
        shards: ShardLayout,
        writes: bool,
    },
    TensorParallel {
        mesh: &'l GptMesh,
        splits: &'l [(EntryId, Split)],
        zero_shards: Option<&'l ShardLayout>,
    },
}

impl Layout<'_> {
    /// This rank's role for a trainer whose flat buffers hold `len` values.
    fn role(&self, len: usize) -> Result<Role<'_>> {
        Ok(match self {
            Layout::TensorParallel {
                mesh,
                splits,
                zero_shards,
            } => Role::TensorParallel {
                mesh,
                splits,
                zero_shards: zero_shards.as_ref(),
            },
            Layout::Replicated {
                zero: Some((replicas, shards)),
                ..
            } => Role::Sharded {
                group: Group::Job(replicas.clone()),
                shards: shards.clone(),
                writes: true,
            },
            Layout::Replicated {
                zero: None,
                solo,
                first_replica,
            } => Role::Sharded {
                group: match solo {
                    Some(solo) => Group::Job(solo.clone()),
                    None => Group::Alone(Box::new(ShmCommunicator::new_thread_group(1)?.remove(0))),
                },
                shards: ShardLayout::new(len, 1),
                writes: *first_replica,
            },
        })
    }
}

/// Where in the run a checkpoint is written.
pub struct SavePoint<'a> {
    /// Steps done.
    pub step: usize,
    /// Keep the newest this many checkpoints.
    pub keep_last: Option<usize>,
    /// This rank's sums over the current epoch's steps so far (empty at an epoch's end).
    pub epoch_totals: &'a [f64],
}

impl<'a> SavePoint<'a> {
    /// The checkpoint after `step` steps, in epochs of `steps_per_epoch`: with this rank's sums
    /// `totals` over the epoch so far, none when the step ends an epoch.
    pub fn after(
        step: usize,
        steps_per_epoch: usize,
        totals: &'a [f64],
        keep_last: Option<usize>,
    ) -> Self {
        let epoch_totals = match step.is_multiple_of(steps_per_epoch) {
            true => &[],
            false => totals,
        };
        Self {
            step,
            keep_last,
            epoch_totals,
        }
    }
}

/// Writes the checkpoint of `trainer` (pipeline stage `stage`'s part) at `at` into run folder
/// `run` (a collective over the job), completes it, and keeps the newest `at.keep_last`.
pub fn save(
    trainer: &mut Trainer,
    (layout, stage): (&Layout<'_>, Stage),
    ctx: &RankContext,
    run: &Path,
    at: SavePoint<'_>,
) -> Result<PathBuf> {
    let dir = run_checkpoints::step_dir(run, at.step);
    let part = stage.part(&dir);
    let epoch_totals = gather(ctx, at.epoch_totals)?;
    match layout.role(trainer.grads().layout().len())? {
        Role::Sharded {
            group,
            shards,
            writes,
        } => {
            if writes {
                save_sharded(trainer, group.comm(), &shards, &part)?;
            }
            ctx.barrier()?;
        }
        Role::TensorParallel {
            mesh,
            splits,
            zero_shards,
        } => save_tensor_parallel(trainer, mesh, splits, zero_shards, &part)?,
    }
    if ctx.is_main() {
        let progress = Progress {
            step: at.step,
            loss_scaler: trainer.loss_scaler().map(|s| s.state().clone()),
            epoch_totals,
        };
        run_checkpoints::complete(&dir, &progress)?;
        if let Some(keep) = at.keep_last {
            run_checkpoints::prune(run, keep)?;
        }
    }
    ctx.barrier()?;
    Ok(dir)
}

/// Every rank's `values` (the same length on each), in rank order; empty when they are.
fn gather(ctx: &RankContext, values: &[f64]) -> Result<Vec<Vec<f64>>> {
    let mut all = vec![0.0; values.len() * ctx.world_size];
    all[ctx.rank * values.len()..][..values.len()].copy_from_slice(values);
    ctx.sum(&mut all)?;
    Ok(all
        .chunks(values.len().max(1))
        .filter(|_| !values.is_empty())
        .map(<[f64]>::to_vec)
        .collect())
}

/// This rank's part of a checkpoint's epoch totals: its own when the job has as many ranks as
/// the one that wrote them; otherwise rank 0 carries their sum (the epoch line's value, summed
/// in another order).
fn own_epoch_totals(progress: &Progress, ctx: &RankContext) -> Vec<f64> {
    let totals = &progress.epoch_totals;
    if totals.len() == ctx.world_size {
        return totals[ctx.rank].clone();
    }
    let width = totals.first().map_or(0, Vec::len);
    let mut sum = vec![0.0; width];
    if ctx.is_main() {
        for part in totals {
            sum.iter_mut().zip(part).for_each(|(s, v)| *s += v);
        }
    }
    sum
}

/// A resumed run: its folder, the step it goes on from, and this rank's sums over the epoch's
/// steps before that step (empty when it starts an epoch).
pub struct Resumed {
    pub run: RunFolder,
    pub start: usize,
    pub epoch_totals: Vec<f64>,
}

impl Resumed {
    /// A run starting afresh in the new folder `run`.
    pub fn fresh(run: RunFolder) -> Self {
        Self {
            run,
            start: 0,
            epoch_totals: Vec::new(),
        }
    }
}

/// Loads checkpoint `dir` into `trainer` and sets it to continue after `progress.step` steps;
/// `stages` says whether the checkpoint holds pipeline stages to join (for a run without a
/// pipeline), else `dir` is this rank's part.
pub fn load(
    trainer: &mut Trainer,
    layout: &Layout<'_>,
    (dir, stages): (&Path, Option<usize>),
    progress: &Progress,
) -> Result<()> {
    let role = layout.role(trainer.grads().layout().len())?;
    refuse_other_layout(dir, &role)?;
    let written_tp = gpt_checkpoint::written_tp_size(dir)?;
    // Parts written with a parallelism this run has not are joined into the whole model.
    match (role, stages, written_tp) {
        (Role::Sharded { group, shards, .. }, Some(count), _) => {
            let parts = Parts::Stages { count };
            load_joined(trainer, (&shards, group.comm().rank()), dir, parts)?
        }
        (Role::Sharded { group, shards, .. }, None, Some(size)) => {
            let parts = Parts::TensorParallel { size };
            load_joined(trainer, (&shards, group.comm().rank()), dir, parts)?
        }
        (Role::Sharded { group, shards, .. }, None, None) => {
            load_sharded(trainer, group.comm(), &shards, dir)?
        }
        (Role::TensorParallel { .. }, Some(_), _) => bail!(
            "{}: written with a pipeline, this run has --tp but none: resume it with the --pp it was written with",
            dir.display()
        ),
        (
            Role::TensorParallel {
                mesh, zero_shards, ..
            },
            None,
            _,
        ) => load_tensor_parallel(trainer, mesh, zero_shards, dir)?,
    }
    if let (Some(state), Some(scaler)) = (&progress.loss_scaler, trainer.loss_scaler_mut()) {
        scaler.load_state(state.clone())?;
    }
    trainer.resume_at_step(progress.step as u64);
    Ok(())
}

/// Refuses, in one line, a checkpoint written without tensor parallelism for a run with it (a
/// tensor-parallel one is joined for a run without it; ZeRO stages and replica counts may
/// change).
fn refuse_other_layout(dir: &Path, role: &Role<'_>) -> Result<()> {
    match (role, gpt_checkpoint::written_tp_size(dir)?) {
        (Role::TensorParallel { mesh, .. }, None) => bail!(
            "{}: written without tensor parallelism, this run has --tp {}: resume it with --tp 1",
            dir.display(),
            mesh.tp.as_ref().map_or(1, |g| g.size())
        ),
        _ => Ok(()),
    }
}

/// `--resume PATH`: loads the checkpoint PATH names into `trainer` and reopens its run folder
/// (checkpoints past it discarded, `metrics.jsonl` cut back to the steps and whole epochs
/// before it; every epoch holds `batches_per_epoch` steps).
pub fn resume_run(
    path: &Path,
    trainer: &mut Trainer,
    (layout, stage): (&Layout<'_>, Stage),
    batches_per_epoch: usize,
    ctx: &RankContext,
) -> Result<Resumed> {
    let (dir, run_path) = run_checkpoints::resolve(path)?;
    let progress = run_checkpoints::read_progress(&dir)?;
    let written = Stage::written(&dir)?;
    // A pipelined checkpoint resumes in a run without a pipeline (its stages joined); other
    // changes of --pp are refused.
    let stages = match (written, stage.count) {
        (w, c) if w == c => None,
        (w, 1) => Some(w),
        (w, c) => bail!(
            "{}: written with --pp {w}, this run has --pp {c}: resume it with --pp {w} or without a pipeline",
            dir.display()
        ),
    };
    let start = progress.step;
    if ctx.is_main() {
        run_checkpoints::discard_after(&run_path, start)?;
    }
    let first_epoch = start / batches_per_epoch.max(1);
    let earlier = |line: &serde_json::Value| {
        let number = |key| line.get(key).and_then(serde_json::Value::as_u64);
        match number("step") {
            Some(s) => (s as usize) < start,
            None => number("epoch").is_some_and(|e| (e as usize) < first_epoch),
        }
    };
    let run = RunFolder::reopen(&run_path, earlier, ctx)?;
    let part = match stages {
        Some(_) => dir.clone(),
        None => stage.part(&dir),
    };
    load(trainer, layout, (&part, stages), &progress)?;
    Ok(Resumed {
        run,
        start,
        epoch_totals: own_epoch_totals(&progress, ctx),
    })
}
