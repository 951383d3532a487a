//! gpu-check-ddp's ZeRO rows beyond the training scenarios: ZeRO-2's reduced gradients
//! against DDP's, and ZeRO-3 over a model built as shards against one GPU.

use std::sync::Arc;

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_collectives::Communicator;
use weft_models::resnet;
use weft_parallel::zero::{zero_stage3_from_shard, ShardLayout};
use weft_parallel::DdpConfig;
use weft_tensor::sharded_init::ShardedInit;
use weft_tensor::{residency, Mode};
use weft_train::parallelize::{self, ResNetParallelism};

use super::ddp::{batch, max_abs, parameters, resnet18, trainer, trainer_of, PER_RANK, ROW, STEPS};

/// One step's reduced gradients under ZeRO-2 against DDP's, over this rank's shard (both from
/// the same parameters and batch): rank 0 prints the row, and where the first difference is.
pub(super) fn zero2_gradients(comm: &Arc<dyn Communicator>, device: &Device) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let (x, y) = batch(PER_RANK * world, 0, device)?;
    let mine = |t: &Tensor| t.narrow(0, rank * PER_RANK, PER_RANK);
    let mut grads = Vec::new();
    for zero in [0, 2] {
        let plan = ResNetParallelism {
            zero,
            ddp: DdpConfig {
                bucket_cap_mb: 0.5,
                first_bucket_cap_mb: 0.1,
                ..DdpConfig::default()
            },
            ..ResNetParallelism::default()
        };
        let mut t =
            parallelize::resnet(trainer(1, device, Mode::EVAL, device)?, Some(comm), &plan)?;
        t.step(&mine(&x)?, &mine(&y)?, 0.0)?;
        // ZeRO-2 keeps this rank's shard of the gradients only.
        let shards = weft_parallel::zero::ShardLayout::new(t.grads().layout().len(), world);
        let own = shards.range(rank);
        grads.push(t.grads().range(&own)?.copy()?);
    }
    let diff = (&grads[1] - &grads[0])?.abs()?;
    let error = diff.max(0)?.to_scalar::<f64>()? / max_abs(&grads[0])?;
    if rank == 0 {
        let host: Vec<f64> = diff.to_vec1()?;
        if let Some(first) = host.iter().position(|&d| d != 0.0) {
            let last = host.iter().rposition(|&d| d != 0.0).unwrap_or(first);
            let count = host.iter().filter(|&&d| d != 0.0).count();
            println!("gpu-check-ddp: ZeRO-2 gradients differ at {count} elements in {first}..={last} of {}", host.len());
        }
        println!("{ROW}\tZeRO-2 {world} GPUs: reduced gradients = DDP's\t{error:e}\t1e-12");
    }
    Ok(())
}

/// ZeRO-3 over a ResNet-18 built as shards — every rank builds it from the same seed and
/// never holds it whole — against one process on rank 0's GPU; rank 0 prints two rows.
pub(super) fn zero3_built_as_shards(comm: &Arc<dyn Communicator>, device: &Device) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let config = resnet18(1)?;
    let build = || resnet(&config, DType::F64, device);
    let (_, len) = ShardedInit::count(build)?;
    let window = ShardLayout::new(len, world).range(rank);
    let (model, shard) = ShardedInit::capture(window, build)?;
    // Each released variable keeps one element on a GPU.
    let store = model.store();
    let held: usize = store
        .parameter_ids()
        .iter()
        .map(|&id| residency::resident_bytes(store.entries()[id].tensor()))
        .sum();
    let one_each = store.parameter_ids().len() * 8;
    let t = trainer_of(model, Mode::EVAL, device)?;
    let ddp = DdpConfig {
        bucket_cap_mb: 0.5,
        first_bucket_cap_mb: 0.1,
        ..DdpConfig::default()
    };
    let strategy = zero_stage3_from_shard(t.model(), t.grads(), comm.clone(), ddp, shard)?;
    let mut t = t.with_strategy(Box::new(strategy))?;
    for step in 0..STEPS {
        let (x, y) = batch(PER_RANK * world, step, device)?;
        let mine = |t: &Tensor| t.narrow(0, rank * PER_RANK, PER_RANK);
        t.step(&mine(&x)?, &mine(&y)?, 1e-3)?;
    }
    let trained = parameters(&mut t)?;
    if rank == 0 {
        let mut single = trainer(1, device, Mode::EVAL, device)?;
        for step in 0..STEPS {
            let (x, y) = batch(PER_RANK * world, step, device)?;
            single.step(&x, &y, 1e-3)?;
        }
        let expected = parameters(&mut single)?;
        let error = max_abs(&(&trained - &expected)?)? / max_abs(&expected)?;
        println!("{ROW}\tZeRO-3 built as shards {world} GPUs = 1 GPU\t{error:e}\t1e-9");
        let excess = held.abs_diff(one_each) as f64;
        println!("{ROW}\tZeRO-3 built as shards: bytes held after the build = 1 element per variable\t{excess:e}\t0");
    }
    Ok(())
}
