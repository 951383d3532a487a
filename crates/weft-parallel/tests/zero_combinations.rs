//! ZeRO with the rest of the step: a bf16 working copy with fp32 master weights, an fp16 one
//! with dynamic loss scaling, and SyncBatchNorm in training mode, each under ZeRO-1, -2 and -3
//! against DDP on 2 thread ranks. The shm backend sums the ranks in rank order both in an
//! all-reduce and in a reduce into the owner, each rank steps its shard with the element-wise
//! rule the whole-buffer step applies, and the all-gather copies the rounded 16-bit values
//! exactly (as do stage 3's gathers of each block): so the parameters must be bit-identical to
//! DDP's (tolerance 0). A backend that
//! ordered its sums differently would differ by the rounding of one 16-bit working copy.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use weft_collectives::Communicator;
use weft_models::loss::Classification;
use weft_optim::{AdamWConfig, ModelOptimizer, OptimizerConfig, ParamGroups};
use weft_parallel::zero::{zero_stage1, zero_stage2, zero_stage3};
use weft_parallel::{
    convert_sync_batch_norm, DdpConfig, DistributedDataParallel, Strategy, Trainer,
};
use weft_precision::{DynamicLossScaler, ScalerConfig};
use weft_tensor::{Checkpointing, Mode};
use weft_testing::{flat_params, image_batches, on_thread_ranks, tiny_resnet};

const PER_RANK: usize = 2;

/// How the run computes: the working copy's dtype, loss scaling, SyncBatchNorm.
#[derive(Clone, Copy)]
struct Setup {
    dtype: DType,
    scaled: bool,
    sync_bn: bool,
}

/// Every rank's parameters after a step on each of `batches` under ZeRO stage `zero` (0: DDP).
fn run(setup: Setup, zero: u8, batches: &[(Tensor, Tensor)]) -> Vec<Vec<f64>> {
    on_thread_ranks(2, |rank, comm: Arc<dyn Communicator>| {
        let config = OptimizerConfig::AdamW(AdamWConfig {
            lr: 0.01,
            ..AdamWConfig::default()
        });
        let optimizer =
            ModelOptimizer::new(config, ParamGroups::default(), &Device::Cpu, DType::F32).unwrap();
        let model = tiny_resnet(0, 3, setup.dtype);
        if setup.sync_bn {
            convert_sync_batch_norm(&model, comm.clone());
        }
        let mode = if setup.sync_bn {
            Mode::TRAIN
        } else {
            Mode::EVAL
        };
        let mut t = Trainer::new(
            model,
            Box::new(Classification),
            optimizer,
            Checkpointing::None,
        )
        .unwrap()
        .with_mode(mode);
        if setup.scaled {
            t = t.with_loss_scaler(DynamicLossScaler::new(ScalerConfig::default()).unwrap());
        }
        let (model, grads, ddp) = (t.model(), t.grads(), DdpConfig::default());
        let strategy: Box<dyn Strategy> = match zero {
            0 => Box::new(DistributedDataParallel::new(model, grads, comm, ddp).unwrap()),
            1 => Box::new(zero_stage1(model, grads, comm, ddp).unwrap()),
            2 => Box::new(zero_stage2(model, grads, comm, ddp).unwrap()),
            _ => Box::new(zero_stage3(model, grads, comm, ddp).unwrap()),
        };
        let mut t = t.with_strategy(strategy).unwrap();
        for (x, y) in batches {
            let mine = |t: &Tensor| t.narrow(0, rank * PER_RANK, PER_RANK).unwrap();
            let outcome = t
                .step(&mine(x).to_dtype(setup.dtype).unwrap(), &mine(y), 0.01)
                .unwrap();
            assert!(!outcome.skipped, "no step skipped");
        }
        t.with_full_parameters(|model| Ok(flat_params(model.store())))
            .unwrap()
    })
}

fn check(setup: Setup, what: &str) {
    let batches = image_batches(3, 2 * PER_RANK);
    let ddp = run(setup, 0, &batches);
    for zero in [1, 2, 3] {
        let sharded = run(setup, zero, &batches);
        for rank in 0..2 {
            let worst = sharded[rank]
                .iter()
                .zip(&ddp[rank])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            let differ = sharded[rank]
                .iter()
                .zip(&ddp[rank])
                .filter(|(a, b)| a != b)
                .count();
            assert!(
                worst == 0.0,
                "{what}: ZeRO-{zero}, rank {rank}: {differ} of {} differ, by up to {worst:e}",
                ddp[rank].len()
            );
        }
    }
    assert_ne!(
        ddp[0],
        flat_params(tiny_resnet(0, 3, setup.dtype).store()),
        "{what}: trained"
    );
}

#[test]
fn zero_under_bf16_mixed_precision_equals_ddp() {
    let setup = Setup {
        dtype: DType::BF16,
        scaled: false,
        sync_bn: false,
    };
    check(setup, "bf16-mixed");
}

#[test]
fn zero_under_fp16_with_loss_scaling_equals_ddp() {
    let setup = Setup {
        dtype: DType::F16,
        scaled: true,
        sync_bn: false,
    };
    check(setup, "fp16-mixed, loss scaled");
}

#[test]
fn zero_with_sync_batch_norm_in_training_mode_equals_ddp() {
    let setup = Setup {
        dtype: DType::F32,
        scaled: false,
        sync_bn: true,
    };
    check(setup, "SyncBatchNorm");
}
