//! The rank side of gpu-check's data-parallel rows (`xtask gpu-check-ddp`, started on every GPU
//! by `weft-run`): ResNet-18 in f64 trained with `DistributedDataParallel` over NCCL (small
//! buckets, so many all-reduces are in flight during backward; buffers broadcast before each
//! forward; the tensor SGD), each rank on its share of the global batch, against one process
//! training on the whole batch. BatchNorm uses either its running statistics (evaluation mode)
//! or the global batch's (SyncBatchNorm, training mode), so the two runs differ only in the
//! order of floating-point sums: so do each step's loss summed over the ranks inside the step
//! and the one process's loss. Rank 0 prints the rows.

use std::sync::Arc;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use weft_collectives::{Communicator, LaunchEnv, ReduceOp};
use weft_models::loss::Classification;
use weft_models::{resnet, ResNetConfig};
use weft_optim::{ModelOptimizer, OptimizerConfig, ParamGroups, SgdConfig};
use weft_parallel::ddp::BucketPlan;
use weft_parallel::{init_for_device, TensorCollectives};
use weft_parallel::{DdpConfig, Trainer};
use weft_precision::{DynamicLossScaler, ScalerConfig};
use weft_tensor::{BlockModel, Checkpointing, Mode};
use weft_train::parallelize::{self, ResNetParallelism};

use super::zero;

/// Images per rank and steps.
pub(super) const PER_RANK: usize = 2;
pub(super) const STEPS: usize = 3;
/// The marker of a result line, read by the parent gpu-check.
pub const ROW: &str = "gpu-check-row";

/// A deterministic global batch (the same on every rank): images and labels of `n` samples.
pub(super) fn batch(n: usize, step: usize, device: &Device) -> Result<(Tensor, Tensor)> {
    let len = n * 3 * 64 * 64;
    let values: Vec<f64> = (0..len)
        .map(|i| ((i * 7919 + step * 104_729) % 2003) as f64 / 1001.5 - 1.0)
        .collect();
    let images = Tensor::from_vec(values, (n, 3, 64, 64), device)?;
    let labels: Vec<u32> = (0..n).map(|i| ((i * 3 + step) % 10) as u32).collect();
    Ok((images, Tensor::from_vec(labels, n, device)?))
}

/// ResNet-18 in f64 on `device`, its SGD on `optimizer_device` (the CPU: ZeRO-Offload).
pub(super) fn trainer(
    seed: u64,
    device: &Device,
    mode: Mode,
    optimizer_device: &Device,
) -> Result<Trainer> {
    let model = resnet(&resnet18(seed)?, DType::F64, device)?;
    trainer_of(model, mode, optimizer_device)
}

pub(super) fn resnet18(seed: u64) -> Result<ResNetConfig> {
    Ok(ResNetConfig::from_name("resnet18", 10)?.with_seed(seed))
}

/// `model` with SGD on `optimizer_device`.
pub(super) fn trainer_of(
    model: BlockModel,
    mode: Mode,
    optimizer_device: &Device,
) -> Result<Trainer> {
    let sgd = OptimizerConfig::Sgd(SgdConfig {
        lr: 1e-3,
        momentum: 0.9,
        weight_decay: 1e-4,
        ..SgdConfig::default()
    });
    let optimizer = ModelOptimizer::new(sgd, ParamGroups::default(), optimizer_device, DType::F64)?;
    let trainer = Trainer::new(
        model,
        Box::new(Classification),
        optimizer,
        Checkpointing::None,
    )?;
    Ok(trainer.with_mode(mode))
}

/// Every parameter, flattened and concatenated, on `device` (gathered under ZeRO-3: a
/// collective).
pub(super) fn parameters(t: &mut Trainer) -> Result<Tensor> {
    Ok(t.with_full_parameters(|model| {
        let store = model.store();
        let flat: Vec<Tensor> = store
            .parameter_ids()
            .into_iter()
            .map(|id| store.entries()[id].tensor().flatten_all())
            .collect::<candle_core::Result<_>>()?;
        Ok(Tensor::cat(&flat, 0)?)
    })?)
}

pub(super) fn max_abs(t: &Tensor) -> Result<f64> {
    Ok(t.abs()?.max(0)?.to_scalar::<f64>()?)
}

/// Runs on every rank of a `weft-run` job with one GPU per rank.
pub fn run_rank() -> Result<()> {
    let env = LaunchEnv::from_env().context("gpu-check-ddp runs under weft-run")?;
    let device = Device::new_cuda(env.local_rank)?;
    #[cfg(feature = "cuda")]
    weft_tensor::cuda_runtime::configure(&device, Default::default())?;
    #[cfg(feature = "cudnn")]
    weft_tensor::ops::set_allow_tf32(false);
    let comm: Arc<dyn Communicator> = Arc::from(init_for_device(&device)?);
    // (SyncBatchNorm, CUDA graph, loss scaler, ZeRO stage, optimizer offloaded to the host)
    let scenarios = [
        (false, false, false, 0, false),
        (true, false, false, 0, false),
        (true, true, false, 0, false),
        (false, true, false, 0, false),
        (false, true, true, 0, false),
        (false, false, false, 1, false),
        (false, false, false, 2, false),
        (false, false, false, 1, true),
        (false, false, false, 2, true),
        (false, false, false, 3, false),
        (true, false, false, 3, false),
        (false, false, false, 3, true),
    ];
    for (sync_bn, graph, scaled, zero, offload) in scenarios {
        scenario(&comm, &device, (sync_bn, graph, scaled), (zero, offload))?;
    }
    zero::zero2_gradients(&comm, &device)?;
    zero::zero3_built_as_shards(&comm, &device)?;
    results_in_flight(&comm, &device)?;
    comm.barrier().wait()?;
    Ok(())
}

/// Many out-of-place all-reduces of views of one tensor in flight while the device computes,
/// each result written back into place once waited for (a ZeRO-2 bucket's life): the tensor
/// must end as the sum over the ranks, exactly (integers in f64).
fn results_in_flight(comm: &Arc<dyn Communicator>, device: &Device) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let (chunks, chunk) = (32, 1 << 16);
    let value = |r: usize, i: usize| ((r * 7 + i * 13) % 17) as f64;
    let mine: Vec<f64> = (0..chunks * chunk).map(|i| value(rank, i)).collect();
    let big = Tensor::from_vec(mine, chunks * chunk, device)?;
    let mut works = Vec::new();
    for c in 0..chunks {
        let view = big.narrow(0, c * chunk, chunk)?;
        works.push(comm.all_reduce_tensor(&view, ReduceOp::Sum)?);
        // Work that allocates and frees on the compute stream meanwhile.
        let noise = Tensor::randn(0f64, 1.0, (256, 256), device)?;
        drop(noise.matmul(&noise)?.sum_all()?);
    }
    for (c, work) in works.into_iter().enumerate() {
        big.slice_set(&work.wait()?, 0, c * chunk)?;
    }
    let got: Vec<f64> = big.to_vec1()?;
    let wrong = (0..got.len())
        .filter(|&i| got[i] != (0..world).map(|r| value(r, i)).sum::<f64>())
        .count();
    if rank == 0 {
        println!("{ROW}\tall-reduce results in flight, written back: wrong elements\t{wrong}\t0");
    }
    Ok(())
}

/// DDP (ZeRO stage `zero` over it, each rank's optimizer shard stepped on the host with
/// `offload`) on every rank (replaying its step from a CUDA graph with `graph`, both runs with
/// a dynamic loss scaler with `scaled`) against one process on rank 0's GPU; rank 0 prints
/// the rows.
fn scenario(
    comm: &Arc<dyn Communicator>,
    device: &Device,
    (sync_bn, graph, scaled): (bool, bool, bool),
    (zero, offload): (u8, bool),
) -> Result<()> {
    let with_scaler = |t: Trainer| -> Result<Trainer> {
        Ok(match scaled {
            true => t.with_loss_scaler(DynamicLossScaler::new(ScalerConfig::default())?),
            false => t,
        })
    };
    // Two eager warm-up steps, the captured one, then replays.
    let steps = if graph { 6 } else { STEPS };
    let (rank, world) = (comm.rank(), comm.world_size());
    let mode = if sync_bn { Mode::TRAIN } else { Mode::EVAL };
    // Another initialisation on every other rank: DDP must overwrite it with rank 0's.
    let optimizer_device = if offload { &Device::Cpu } else { device };
    let ddp = with_scaler(trainer(1 + rank as u64, device, mode, optimizer_device)?)?;
    let plan = ResNetParallelism {
        sync_bn,
        zero,
        ddp: DdpConfig {
            bucket_cap_mb: 0.5,
            first_bucket_cap_mb: 0.1,
            ..DdpConfig::default()
        },
        cuda_graph: graph,
        timeline: None,
        zero3_shard: None,
    };
    let buckets = BucketPlan::new(ddp.grads().layout(), 8, plan.ddp.bucket_caps())
        .buckets()
        .len();
    let mut ddp = parallelize::resnet(ddp, Some(comm), &plan)?;
    let mut replayed = 0;
    // Each step's mean loss over the job, as summed over the ranks inside the step.
    let mut summed_losses = Vec::with_capacity(steps);
    // With the graph, each step is launched before the one before it is read, as the trainer
    // does (`Trainer::launch`): replays queue behind each other, collectives included.
    let mut in_flight = None;
    for step in 0..steps {
        let (x, y) = batch(PER_RANK * world, step, device)?;
        let mine = |t: &Tensor| t.narrow(0, rank * PER_RANK, PER_RANK);
        // Static shapes for the graph: copies of this rank's rows.
        let launched = ddp.launch(&mine(&x)?.copy()?, &mine(&y)?.copy()?, (1, 1e-3))?;
        let mut outcomes = Vec::new();
        if let Some(earlier) = in_flight.take() {
            outcomes.push(ddp.finish(earlier)?);
        }
        match graph && step + 1 < steps {
            true => in_flight = Some(launched),
            false => outcomes.push(ddp.finish(launched)?),
        }
        for outcome in outcomes {
            replayed += usize::from(outcome.graphed);
            let sums = outcome.replicas_loss_sum();
            summed_losses.push(sums.map_or(f64::NAN, |[loss, samples]| loss / samples));
        }
    }
    // ZeRO-2 and -3 keep their shard of the gradients only.
    let gradient_bytes = ddp.model_state_bytes().gradients;
    let shard_of_gradients = {
        let shards = weft_parallel::zero::ShardLayout::new(ddp.grads().layout().len(), world);
        shards.range(rank).len() * ddp.grads().dtype().size_in_bytes()
    };
    // Between steps a ZeRO-3 rank's parameters are its shard, and each released variable
    // keeps one element (the driver refuses empty allocations).
    let held = ddp.model_state_bytes().parameters;
    let store = ddp.model().store();
    let released = store.parameter_ids().len() * store.dtype().size_in_bytes();
    let shard = ddp
        .strategy()
        .parameter_shard()
        .map(|s| s.elem_count() * s.dtype().size_in_bytes() + released);
    let trained = parameters(&mut ddp)?;
    // Every rank against rank 0: all replicas must be identical.
    let reference = comm.broadcast_tensor(&trained, 0)?.wait()?;
    let spread = max_abs(&(&trained - &reference)?)?;
    let spread = comm
        .all_reduce_tensor(&Tensor::new(&[spread], device)?, ReduceOp::Max)?
        .wait()?
        .flatten_all()?
        .to_vec1::<f64>()?[0];
    if rank == 0 {
        let mut single = with_scaler(trainer(1, device, mode, device)?)?;
        let mut loss_error = 0f64;
        for (step, summed) in summed_losses.iter().enumerate() {
            let (x, y) = batch(PER_RANK * world, step, device)?;
            let loss = single.step(&x, &y, 1e-3)?.loss;
            let error = match summed.is_nan() {
                // No sum reported fails the row.
                true => f64::INFINITY,
                false => ((summed - loss) / loss).abs(),
            };
            loss_error = loss_error.max(error);
        }
        let expected = parameters(&mut single)?;
        let mut error = max_abs(&(&trained - &expected)?)? / max_abs(&expected)?;
        let what = match (sync_bn, graph, scaled) {
            (true, false, _) => "SyncBatchNorm, training mode",
            (true, true, _) => "CUDA graph launched ahead, SyncBatchNorm in training mode",
            (false, false, _) => "BatchNorm in eval mode",
            (false, true, false) => "CUDA graph launched ahead, eval-mode BatchNorm",
            (false, true, true) => "CUDA graph, eval-mode BatchNorm, loss scaler",
        };
        if graph && replayed < steps - 3 {
            println!("gpu-check-ddp: only {replayed} of {steps} steps were replayed");
            error = f64::INFINITY;
        }
        let strategy = match (zero, offload) {
            (0, _) => "DDP".to_string(),
            (stage, false) => format!("ZeRO-{stage}"),
            (stage, true) => format!("ZeRO-{stage} + offload"),
        };
        println!(
            "{ROW}\t{strategy} {world} GPUs = 1 GPU, {what}, {buckets} buckets\t{error:e}\t1e-9"
        );
        println!("{ROW}\t{strategy} {world} GPUs, {what}: replicas identical\t{spread:e}\t0");
        println!("{ROW}\t{strategy} {world} GPUs, {what}: loss summed over the ranks in the step = 1 GPU's\t{loss_error:e}\t1e-9");
        if zero >= 2 {
            let excess = gradient_bytes.abs_diff(shard_of_gradients) as f64;
            println!("{ROW}\t{strategy} {world} GPUs: gradient bytes = the shard ({shard_of_gradients})\t{excess:e}\t0");
        }
        if let Some(shard) = shard {
            let excess = held.abs_diff(shard) as f64 / shard as f64;
            println!("{ROW}\t{strategy} {world} GPUs: bytes held between steps = the shard + 1 element per variable ({shard})\t{excess:e}\t0");
        }
    }
    Ok(())
}
