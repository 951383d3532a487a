//! This process's place in a job: its rank, the world size and the communicator, from the
//! launch environment (`weft-run`, torchrun or Slurm), or a single process when there is none.

use std::sync::Arc;

use anyhow::{Context, Result};
use candle_core::Device;
use weft_collectives::{Buffer, Communicator, ReduceOp};

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
    pub fn from_env(device: &Device) -> Result<Self> {
        let world: usize = std::env::var("WORLD_SIZE")
            .or_else(|_| std::env::var("SLURM_NTASKS"))
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        if world <= 1 {
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

    /// Waits until every rank got here.
    pub fn barrier(&self) -> Result<()> {
        if let Some(comm) = &self.comm {
            comm.barrier().wait()?;
        }
        Ok(())
    }
}
