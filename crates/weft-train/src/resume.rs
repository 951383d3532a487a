//! Saving and resuming a trainer's state in [`crate::run_checkpoints`]'s folders, in every
//! layout: ZeRO's sharded format, written by every replica under ZeRO (each its shard) and by the
//! first replica alone under plain data parallelism (every replica holds the whole state), read
//! back by any number of replicas; the tensor-parallel format of [`crate::gpt_checkpoint`] under
//! `--tp`; under `--pp` each stage's part in a folder of its own. A checkpoint resumes in a run
//! with another `--tp` or `--pp` too, read whole and cut anew (`gpt_checkpoint_resplit.rs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use weft_collectives::{Communicator, ShmCommunicator};
use weft_parallel::zero::checkpoint::load_sharded;
use weft_parallel::zero::shard_part::prepare_sharded;
use weft_parallel::zero::ShardLayout;
use weft_parallel::Trainer;
use weft_tensor::EntryId;

use crate::checkpoint_write::{self, Part};
use crate::distributed::RankContext;
use crate::gpt_checkpoint::{self, load_tensor_parallel, prepare_tensor_parallel};
use crate::gpt_checkpoint_resplit::{load_resplit, written_split, Holding, Slices};
use crate::gpt_parallel::GptMesh;
use crate::run_checkpoints::{self, CheckpointFlags, Progress, Stage};
use crate::run_dir::RunFolder;
use crate::tp_split::Split;

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
    /// How long the ranks may take to write it (`--save-timeout`).
    pub timeout: Duration,
    /// This rank's sums over the current epoch's steps so far (empty at an epoch's end).
    pub epoch_totals: &'a [f64],
}

impl<'a> SavePoint<'a> {
    /// The checkpoint after `step` steps, in epochs of `steps_per_epoch`, as `flags` say: with
    /// this rank's sums `totals` over the epoch so far, none when the step ends an epoch.
    pub fn after(
        step: usize,
        steps_per_epoch: usize,
        totals: &'a [f64],
        flags: &CheckpointFlags,
    ) -> Self {
        let epoch_totals = match step.is_multiple_of(steps_per_epoch) {
            true => &[],
            false => totals,
        };
        Self {
            step,
            keep_last: flags.keep_last,
            timeout: Duration::from_secs_f64(flags.save_timeout),
            epoch_totals,
        }
    }
}

/// Writes the checkpoint of `trainer` (pipeline stage `stage`'s part) at `at` into run folder
/// `run` (a collective over the job: every rank's part gathered to the host, written under
/// `at.timeout`, committed), completes it with its record, and keeps the newest `at.keep_last`.
pub fn save(
    trainer: &mut Trainer,
    (layout, stage): (&Layout<'_>, Stage),
    ctx: &RankContext,
    run: &Path,
    at: SavePoint<'_>,
) -> Result<PathBuf> {
    let dir = run_checkpoints::step_dir(run, at.step);
    let part_dir = stage.part(&dir);
    let epoch_totals = gather(ctx, at.epoch_totals)?;
    let part = match layout.role(trainer.grads().layout().len())? {
        Role::Sharded {
            group,
            shards,
            writes,
        } => {
            let comm = group.comm();
            let at = (comm.rank(), comm.world_size());
            let own = writes.then(|| prepare_sharded(trainer, at, &shards, &part_dir));
            Part::Sharded(own.transpose()?)
        }
        Role::TensorParallel {
            mesh,
            splits,
            zero_shards,
        } => Part::TensorParallel(prepare_tensor_parallel(
            trainer,
            mesh,
            splits,
            zero_shards,
            &part_dir,
        )?),
    };
    checkpoint_write::write_everywhere(part, ctx, &dir, at.timeout)?.commit(ctx)?;
    if ctx.is_main() {
        let progress = Progress {
            step: at.step,
            loss_scaler: trainer.loss_scaler_state()?,
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

/// Loads checkpoint `dir`, written with `written_stages` pipeline stages, into `trainer`
/// (pipeline stage `stage`'s part, held as `layout` says) and sets it to continue after
/// `progress.step` steps. A checkpoint cut as this run cuts its state is read part by part;
/// one cut another way (another `--tp` or `--pp`) is read whole by every rank and cut anew.
fn load(
    trainer: &mut Trainer,
    (layout, stage): (&Layout<'_>, Stage),
    (dir, written_stages): (&Path, usize),
    progress: &Progress,
    ctx: &RankContext,
) -> Result<()> {
    let role = layout.role(trainer.grads().layout().len())?;
    let this_tp = match &role {
        Role::TensorParallel { mesh, .. } => mesh.tp.as_ref().map(|g| g.size()),
        Role::Sharded { .. } => None,
    };
    let same_cut = written_stages == stage.count && written_split(dir, written_stages)? == this_tp;
    let part = stage.part(dir);
    match role {
        Role::Sharded { group, shards, .. } if same_cut => {
            load_sharded(trainer, group.comm(), &shards, &part)?
        }
        Role::TensorParallel {
            mesh, zero_shards, ..
        } if same_cut => load_tensor_parallel(trainer, mesh, zero_shards, &part)?,
        Role::Sharded { group, shards, .. } => {
            let holding = Holding {
                tensor_parallel: None,
                shards: (&shards, group.comm().rank()),
            };
            load_resplit(trainer, (dir, written_stages), holding, ctx)?
        }
        Role::TensorParallel {
            mesh,
            splits,
            zero_shards,
        } => {
            let group = mesh
                .tp
                .as_ref()
                .context("a tensor-parallel run has a group")?;
            let len = trainer.grads().layout().len();
            let (comm, shards, _) = gpt_checkpoint::role(mesh, zero_shards, len)?;
            let holding = Holding {
                tensor_parallel: Some(Slices {
                    splits,
                    rank: group.rank(),
                    size: group.size(),
                }),
                shards: (&shards, comm.rank()),
            };
            load_resplit(trainer, (dir, written_stages), holding, ctx)?
        }
    }
    if let Some(state) = &progress.loss_scaler {
        trainer.load_loss_scaler_state(state)?;
    }
    trainer.resume_at_step(progress.step as u64);
    Ok(())
}

/// `--resume PATH`: loads the checkpoint PATH names into `trainer` — PATH itself, which must be
/// whole, or run folder PATH's newest checkpoint that every rank finds whole ([`choose`]) —,
/// then reopens its run folder (checkpoints past it discarded, `metrics.jsonl` cut back to the
/// steps and whole epochs before it; every epoch holds `batches_per_epoch` steps) — only once
/// the load succeeded.
pub fn resume_run(
    path: &Path,
    trainer: &mut Trainer,
    (layout, stage): (&Layout<'_>, Stage),
    batches_per_epoch: usize,
    ctx: &RankContext,
) -> Result<Resumed> {
    let candidates = run_checkpoints::candidates(path)?;
    let (dir, progress) = choose(&candidates, path, ctx)?;
    let written_stages = Stage::written(&dir)?;
    let start = progress.step;
    // The checkpoint is loaded (every manifest, header and shape checked) before anything of
    // the run folder is removed or cut: a resume that fails leaves the run as it was.
    load(
        trainer,
        (layout, stage),
        (&dir, written_stages),
        &progress,
        ctx,
    )?;
    let run_path = candidates.run;
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
    Ok(Resumed {
        run,
        start,
        epoch_totals: own_epoch_totals(&progress, ctx),
    })
}

/// The checkpoint to resume from and its record: the newest of `candidates` that every rank
/// finds whole ([`run_checkpoints::check`]; the ranks agree through one sum a candidate, so all
/// take the same). A damaged one is skipped with a warning naming it and why, unless PATH named
/// it (then it is the error); none whole is an error listing what was skipped, never a fresh
/// start.
fn choose(
    candidates: &run_checkpoints::Candidates,
    path: &Path,
    ctx: &RankContext,
) -> Result<(PathBuf, Progress)> {
    let mut skipped = Vec::new();
    for dir in &candidates.dirs {
        let checked = run_checkpoints::check(dir);
        let mut damaged = [f64::from(u8::from(checked.is_err()))];
        ctx.sum(&mut damaged)?;
        match checked {
            Ok(progress) if damaged[0] == 0.0 => return Ok((dir.clone(), progress)),
            Err(err) if candidates.named => {
                return Err(err.context(format!("--resume {}: damaged", path.display())))
            }
            Ok(_) if candidates.named => anyhow::bail!(
                "--resume {}: damaged on another rank (its log says why)",
                path.display()
            ),
            Err(err) => {
                tracing::warn!("skipping damaged checkpoint {}: {err:#}", dir.display());
                skipped.push(dir.display().to_string());
            }
            Ok(_) => skipped.push(dir.display().to_string()),
        }
    }
    match skipped.is_empty() {
        true => anyhow::bail!(
            "--resume {}: no checkpoint in {}",
            path.display(),
            candidates.run.join("checkpoints").display()
        ),
        false => anyhow::bail!(
            "--resume {}: no whole checkpoint (damaged: {})",
            path.display(),
            skipped.join(", ")
        ),
    }
}
