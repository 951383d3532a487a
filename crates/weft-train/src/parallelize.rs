//! The per-model set-up of parallelism (torchtitan's `parallelize` step): given a trainer of
//! the model and the job's communicator, which strategy it trains under, whether its batch
//! norms are synchronised, and whether the step is replayed from a CUDA graph. One function
//! per model, used by the trainer, the benchmarks, gpu-check and the tests alike.

use std::sync::Arc;

use anyhow::Result;
use weft_collectives::Communicator;
use weft_parallel::{DdpConfig, DistributedDataParallel, SingleProcess, Trainer};
use weft_tensor::Timeline;

/// How a ResNet is parallelised.
#[derive(Debug, Clone, Default)]
pub struct ResNetParallelism {
    /// SyncBatchNorm: batch statistics over the global batch.
    pub sync_bn: bool,
    /// Settings of data parallelism (when there is more than one rank).
    pub ddp: DdpConfig,
    /// Replay the step from a CUDA graph where the strategy allows it.
    pub cuda_graph: bool,
    /// Where DDP records its bucket all-reduces.
    pub timeline: Option<Arc<Timeline>>,
}

/// Data parallelism over `comm`'s ranks (one process without it), SyncBatchNorm if asked,
/// and the CUDA graph where it can capture the step (SyncBatchNorm waits on the host for its
/// statistics: not capturable).
pub fn resnet(
    trainer: Trainer,
    comm: Option<&Arc<dyn Communicator>>,
    plan: &ResNetParallelism,
) -> Result<Trainer> {
    let mut trainer = match comm {
        Some(comm) => {
            if plan.sync_bn {
                weft_parallel::convert_sync_batch_norm(trainer.model(), comm.clone());
            }
            let mut ddp = DistributedDataParallel::new(
                trainer.model(),
                trainer.grads(),
                comm.clone(),
                plan.ddp.clone(),
            )?;
            if let Some(timeline) = &plan.timeline {
                ddp = ddp.with_timeline(timeline.clone());
            }
            trainer.with_strategy(Box::new(ddp))
        }
        None => {
            let single = SingleProcess::new(trainer.model(), plan.ddp.find_unused_parameters);
            trainer.with_strategy(Box::new(single))
        }
    };
    if plan.cuda_graph && !plan.sync_bn {
        trainer = trainer.with_cuda_graph();
    }
    Ok(trainer)
}
