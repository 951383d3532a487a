//! The per-model set-up of parallelism (torchtitan's `parallelize` step): given a trainer of
//! the model and the job's communicator, which strategy it trains under, whether its batch
//! norms are synchronised, and whether the step is replayed from a CUDA graph. One function
//! per model, used by the trainer, the benchmarks, gpu-check and the tests alike.

use std::sync::Arc;

use anyhow::{bail, Result};
use candle_core::Tensor;
use weft_collectives::Communicator;
use weft_parallel::pipeline::PipelineStage;
use weft_parallel::tensor::{TensorParallel, TensorParallelGroup};
use weft_parallel::zero::{zero_stage1, zero_stage2, zero_stage3_from_shard};
use weft_parallel::{DdpConfig, DistributedDataParallel, SingleProcess, Strategy, Trainer};
use weft_tensor::{EntryId, Timeline};

use crate::tp_split::Split;

/// How a ResNet is parallelised.
#[derive(Debug, Clone, Default)]
pub struct ResNetParallelism {
    /// SyncBatchNorm: batch statistics over the global batch.
    pub sync_bn: bool,
    /// ZeRO stage (0: plain DDP; 1, 2: the optimizer sharded over the ranks; 3: the
    /// parameters too).
    pub zero: u8,
    /// Settings of data parallelism (when there is more than one rank).
    pub ddp: DdpConfig,
    /// Replay the step from a CUDA graph where the strategy allows it.
    pub cuda_graph: bool,
    /// Where DDP records its bucket all-reduces.
    pub timeline: Option<Arc<Timeline>>,
    /// Under ZeRO-3, this rank's shard of a model built by a sharded initialisation.
    pub zero3_shard: Option<Tensor>,
}

/// Data parallelism over `comm`'s ranks (one process without it; ZeRO's sharded optimizer
/// with `plan.zero` 1 or 2, and sharded parameters with 3), SyncBatchNorm if asked,
/// and the CUDA graph where it can capture the step (SyncBatchNorm included: its statistics
/// are summed over the ranks on the device, through a communicator of their own).
pub fn resnet(
    trainer: Trainer,
    comm: Option<&Arc<dyn Communicator>>,
    plan: &ResNetParallelism,
) -> Result<Trainer> {
    if let (Some(comm), true) = (comm, plan.sync_bn) {
        // The statistics on a communicator of their own (the same ranks), whose operations run
        // on the compute stream itself, captured or not: the layer waits for each sum at once,
        // so a fork to another stream and back only adds time, and none waits behind a
        // gradient bucket's all-reduce.
        let statistics: Arc<dyn Communicator> = Arc::from(comm.split(0, comm.rank() as i64)?);
        if let Some(device) = statistics.device_collectives() {
            device.set_all_on_compute(true);
        }
        weft_parallel::convert_sync_batch_norm(trainer.model(), statistics);
    }
    let replays = plan.cuda_graph;
    if let (Some(comm), true, 0) = (comm, replays, plan.zero) {
        // The replicas' check and broadcast below run on the compute stream too, as DDP's
        // eager work will once `with_cuda_graph` tells it (`Strategy::replays_graph`).
        if let Some(device) = comm.device_collectives() {
            device.set_eager_on_compute(true);
        }
    }
    let zero = (plan.zero, plan.zero3_shard.clone());
    let strategy = data_parallel(&trainer, comm, zero, &plan.ddp, plan.timeline.as_ref())?;
    let mut trainer = trainer.with_strategy(strategy)?;
    if replays {
        trainer = trainer.with_cuda_graph();
    }
    Ok(trainer)
}

/// How a GPT is parallelised.
#[derive(Clone, Default)]
pub struct GptParallelism {
    /// ZeRO stage over the data-parallel ranks (0: plain DDP).
    pub zero: u8,
    pub ddp: DdpConfig,
    pub timeline: Option<Arc<Timeline>>,
    /// The tensor-parallel group and how the model's entries are split over it (the model
    /// was built by [`crate::gpt_parallel::TensorParallelLayers`]).
    pub tensor: Option<(TensorParallelGroup, Vec<(EntryId, Split)>)>,
    /// The pipeline axis, when the model is one stage of several (built by
    /// `weft_models::gpt::gpt_stage` or `weft_models::llama::llama_stage`), and the name of the
    /// token table the first and last stage both hold (a tied head's), if any.
    pub pipeline: Option<Arc<dyn Communicator>>,
    pub tied_table: Option<&'static str>,
    /// Under ZeRO-3, this rank's shard of a model built by a sharded initialisation.
    pub zero3_shard: Option<Tensor>,
    /// Replay the step from a CUDA graph where the strategy allows it (not under a pipeline,
    /// whose schedule runs its own steps).
    pub cuda_graph: bool,
}

/// Data parallelism (DDP or ZeRO-1/2/3) over the replicas `dp` (one replica without it), inside
/// the tensor-parallel group if there is one, inside the pipeline stage if there is one (the
/// token table's gradient summed between the first and last stage, which both hold it).
pub fn gpt(
    trainer: Trainer,
    dp: Option<&Arc<dyn Communicator>>,
    plan: &GptParallelism,
) -> Result<Trainer> {
    let replays = plan.cuda_graph && plan.pipeline.is_none();
    if let (Some(comm), true, 0) = (dp, replays, plan.zero) {
        // As for a ResNet: the replicas' eager work on the compute stream, as DDP's will be.
        if let Some(device) = comm.device_collectives() {
            device.set_eager_on_compute(true);
        }
    }
    let zero = (plan.zero, plan.zero3_shard.clone());
    let mut strategy = data_parallel(&trainer, dp, zero, &plan.ddp, plan.timeline.as_ref())?;
    if let Some((group, splits)) = &plan.tensor {
        let replicated = trainer
            .grads()
            .layout()
            .slots()
            .iter()
            .filter(|slot| !splits.iter().any(|(entry, _)| *entry == slot.entry))
            .map(|slot| slot.range())
            .collect();
        strategy = Box::new(TensorParallel::new(strategy, group.clone(), replicated));
    }
    if let Some(stages) = &plan.pipeline {
        let store = trainer.model().store();
        let tied = plan
            .tied_table
            .and_then(|name| store.id(name).ok())
            .and_then(|id| trainer.grads().layout().slot_of(id))
            .map(|slot| slot.range());
        strategy = Box::new(PipelineStage::new(strategy, stages.clone(), tied)?);
    }
    let trainer = trainer.with_strategy(strategy)?;
    Ok(match replays {
        true => trainer.with_cuda_graph(),
        false => trainer,
    })
}

/// The data-parallel strategy of ZeRO stage `zero` over `comm`, or one process's.
fn data_parallel(
    trainer: &Trainer,
    comm: Option<&Arc<dyn Communicator>>,
    (zero, zero3_shard): (u8, Option<Tensor>),
    config: &DdpConfig,
    timeline: Option<&Arc<Timeline>>,
) -> Result<Box<dyn Strategy>> {
    let Some(comm) = comm else {
        let single = SingleProcess::new(trainer.model(), config.find_unused_parameters);
        return Ok(Box::new(single));
    };
    let (model, grads, config) = (trainer.model(), trainer.grads(), config.clone());
    let strategy: Box<dyn Strategy> = match zero {
        0 => {
            let mut ddp = DistributedDataParallel::new(model, grads, comm.clone(), config)?;
            if let Some(timeline) = timeline {
                ddp = ddp.with_timeline(timeline.clone());
            }
            Box::new(ddp)
        }
        1 => Box::new(zero_stage1(model, grads, comm.clone(), config)?),
        2 => Box::new(zero_stage2(model, grads, comm.clone(), config)?),
        3 => Box::new(zero_stage3_from_shard(
            model,
            grads,
            comm.clone(),
            config,
            zero3_shard,
        )?),
        other => bail!("--zero {other}: stages 0 to 3 exist"),
    };
    Ok(strategy)
}
