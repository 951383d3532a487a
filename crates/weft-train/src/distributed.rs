//! This process's place in a job: its rank, the world size and the communicator, from the
//! launch environment (`weft-run`, torchrun or Slurm), or a single process when there is none.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::Device;
use weft_collectives::{Buffer, Communicator, ReduceOp};
use weft_parallel::StepOutcome;
use weft_tensor::Timeline;

/// Rank, world size and (for more than one rank) the communicator.
pub struct RankContext {
    pub rank: usize,
    pub world_size: usize,
    pub comm: Option<Arc<dyn Communicator>>,
}

impl RankContext {
    /// One process, no communication.
    pub fn single() -> Self {
        Self {
            rank: 0,
            world_size: 1,
            comm: None,
        }
    }

    /// Joins the job described by the environment when `WORLD_SIZE` (or `SLURM_NTASKS`) says
    /// there is more than one rank, through NCCL when the model is on a GPU and the shm
    /// backend otherwise; a single process when there is one rank.
    /// A malformed `WORLD_SIZE` is an error naming it, never a silent single-process run.
    pub fn from_env(device: &Device) -> Result<Self> {
        if launched_world_size(|name| std::env::var(name).ok())? <= 1 {
            return Ok(Self::single());
        }
        let comm: Arc<dyn Communicator> =
            Arc::from(weft_parallel::init_for_device(device).context("joining the job")?);
        Ok(Self {
            rank: comm.rank(),
            world_size: comm.world_size(),
            comm: Some(comm),
        })
    }

    pub fn is_main(&self) -> bool {
        self.rank == 0
    }

    /// Sums `values` over all ranks, in place.
    pub fn sum(&self, values: &mut [f64]) -> Result<()> {
        if let Some(comm) = &self.comm {
            let summed: Vec<f64> = comm
                .all_reduce(Buffer::from(values.to_vec()), ReduceOp::Sum)
                .wait_vec()?;
            values.copy_from_slice(&summed);
        }
        Ok(())
    }

    /// A step's loss summed over the job's samples, and their count: as the strategy summed
    /// them on the device inside the step, else with a host round trip over the job (recorded
    /// as the span "loss sum" on `timeline`: the device idles meanwhile on more than one rank).
    pub fn step_loss_sum(
        &self,
        outcome: &StepOutcome,
        timeline: Option<&Timeline>,
    ) -> Result<[f64; 2]> {
        if let Some(summed) = outcome.replicas_loss_sum() {
            return Ok(summed);
        }
        let summing = Instant::now();
        let mut local = [
            outcome.loss * outcome.samples as f64,
            outcome.samples as f64,
        ];
        self.sum(&mut local)?;
        if let Some(timeline) = timeline {
            timeline.record("loss sum", "metrics", "host", summing, Instant::now());
        }
        Ok(local)
    }

    /// Waits until every rank got here.
    pub fn barrier(&self) -> Result<()> {
        if let Some(comm) = &self.comm {
            comm.barrier().wait()?;
        }
        Ok(())
    }
}

/// The world size the launcher's variables give: `WORLD_SIZE`, else Slurm's `SLURM_NTASKS` for a
/// task `srun` started ([`launched`]: an `salloc` shell is not a rank); 1 outside a launched
/// job; an error naming the variable when it is not a positive number.
pub fn launched_world_size(lookup: impl Fn(&str) -> Option<String>) -> Result<usize> {
    let slurm_task = lookup("SLURM_PROCID").is_some();
    for var in ["WORLD_SIZE", "SLURM_NTASKS"] {
        if var == "SLURM_NTASKS" && !slurm_task {
            break;
        }
        if let Some(value) = lookup(var) {
            return match value.trim().parse::<usize>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => anyhow::bail!(
                    "{var}={value:?}: the launcher's world size must be a positive number"
                ),
            };
        }
    }
    Ok(1)
}

/// Whether this process is a rank a launcher started: torchrun's or `weft run`'s `WORLD_SIZE`,
/// or Slurm's `SLURM_PROCID` (set by `srun` for each task; `salloc` alone does not).
pub fn launched(lookup: impl Fn(&str) -> Option<String>) -> bool {
    lookup("WORLD_SIZE").is_some() || lookup("SLURM_PROCID").is_some()
}

#[cfg(test)]
mod tests {
    use super::{launched, launched_world_size};

    fn with(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn a_malformed_world_size_is_an_error_not_one_process() {
        assert_eq!(launched_world_size(with(&[])).unwrap(), 1);
        const SRUN_TASK: [(&str, &str); 2] = [("SLURM_NTASKS", "4"), ("SLURM_PROCID", "2")];
        assert_eq!(launched_world_size(with(&SRUN_TASK[..])).unwrap(), 4);
        assert_eq!(launched_world_size(with(&SRUN_TASK[..1])).unwrap(), 1);
        for bad in [
            &[("WORLD_SIZE", "abc")][..],
            &[("WORLD_SIZE", "0")],
            &[("SLURM_NTASKS", "-2"), ("SLURM_PROCID", "0")],
        ] {
            let err = launched_world_size(with(bad)).unwrap_err().to_string();
            assert!(err.contains(bad[0].0) && err.lines().count() == 1, "{err}");
        }
    }

    /// `srun -n4 weft train-resnet` and torchrun start ranks, which train as one each; an
    /// `salloc` shell (Slurm's variables without a task id) is not one, and `--nproc` starts
    /// the ranks there.
    #[test]
    fn a_rank_is_known_by_torchruns_or_sruns_variables() {
        assert!(launched(with(&[("WORLD_SIZE", "2"), ("RANK", "1")])));
        assert!(launched(with(&[
            ("SLURM_NTASKS", "4"),
            ("SLURM_PROCID", "0")
        ])));
        assert!(!launched(with(&[
            ("SLURM_NTASKS", "4"),
            ("SLURM_JOB_ID", "7")
        ])));
        assert!(!launched(with(&[])));
    }
}
