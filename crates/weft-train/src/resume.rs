//! Saving and resuming a trainer's state in [`crate::run_checkpoints`]'s folders, in every
//! layout but the pipeline's: ZeRO's sharded format, written by every replica under ZeRO (each
//! its shard) and by the first replica alone under plain data parallelism (every replica holds
//! the whole state), read back by any number of replicas; the tensor-parallel format of
//! [`crate::gpt_checkpoint`] under `--tp`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;
use weft_collectives::{Communicator, ShmCommunicator};
use weft_parallel::zero::checkpoint::{load_sharded, save_sharded};
use weft_parallel::zero::ShardLayout;
use weft_parallel::Trainer;
use weft_tensor::EntryId;

use crate::distributed::RankContext;
use crate::gpt_checkpoint::{load_tensor_parallel, save_tensor_parallel};
use crate::gpt_parallel::{GptMesh, Split};
use crate::run_checkpoints::{self, Progress};

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

/// For a replicated layout: the group, the shards, and whether this rank writes.
fn sharded_role(
    zero: &Option<(Arc<dyn Communicator>, ShardLayout)>,
    solo: &Option<Arc<dyn Communicator>>,
    first_replica: bool,
    len: usize,
) -> Result<(Group, ShardLayout, bool)> {
    Ok(match (zero, solo) {
        (Some((replicas, shards)), _) => (Group::Job(replicas.clone()), shards.clone(), true),
        (None, Some(solo)) => (
            Group::Job(solo.clone()),
            ShardLayout::new(len, 1),
            first_replica,
        ),
        (None, None) => {
            let alone = ShmCommunicator::new_thread_group(1)?.remove(0);
            (
                Group::Alone(Box::new(alone)),
                ShardLayout::new(len, 1),
                true,
            )
        }
    })
}

/// Writes step `step`'s checkpoint of `trainer` into run folder `run` (a collective over the
/// job), completes it, and keeps the newest `keep_last`.
pub fn save(
    trainer: &mut Trainer,
    layout: &Layout<'_>,
    ctx: &RankContext,
    run: &Path,
    step: usize,
    keep_last: Option<usize>,
) -> Result<PathBuf> {
    let dir = run_checkpoints::step_dir(run, step);
    match layout {
        Layout::TensorParallel {
            mesh,
            splits,
            zero_shards,
        } => save_tensor_parallel(trainer, mesh, splits, zero_shards.as_ref(), &dir)?,
        Layout::Replicated {
            zero,
            solo,
            first_replica,
        } => {
            let len = trainer.grads().layout().len();
            let (group, shards, writes) = sharded_role(zero, solo, *first_replica, len)?;
            if writes {
                save_sharded(trainer, group.comm(), &shards, &dir)?;
            }
            ctx.barrier()?;
        }
    }
    if ctx.is_main() {
        let progress = Progress {
            step,
            loss_scaler: trainer.loss_scaler().map(|s| s.state().clone()),
        };
        run_checkpoints::complete(&dir, &progress)?;
        if let Some(keep) = keep_last {
            run_checkpoints::prune(run, keep)?;
        }
    }
    ctx.barrier()?;
    Ok(dir)
}

/// Loads checkpoint `dir` into `trainer` and sets it to continue after `progress.step` steps.
pub fn load(
    trainer: &mut Trainer,
    layout: &Layout<'_>,
    dir: &Path,
    progress: &Progress,
) -> Result<()> {
    match layout {
        Layout::TensorParallel {
            mesh, zero_shards, ..
        } => load_tensor_parallel(trainer, mesh, zero_shards.as_ref(), dir)?,
        Layout::Replicated {
            zero,
            solo,
            first_replica,
        } => {
            let len = trainer.grads().layout().len();
            let (group, shards, _) = sharded_role(zero, solo, *first_replica, len)?;
            load_sharded(trainer, group.comm(), &shards, dir)?;
        }
    }
    if let (Some(state), Some(scaler)) = (&progress.loss_scaler, trainer.loss_scaler_mut()) {
        scaler.load_state(state.clone())?;
    }
    trainer.resume_at_step(progress.step as u64);
    Ok(())
}
