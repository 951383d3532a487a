//! Building the optimizer and learning-rate schedule from the trainer's flags.

use anyhow::{bail, Result};
use candle_core::{DType, Device};
use weft_optim::{
    schedule_from_name, AdamWConfig, LrSchedule, ModelOptimizer, OptimizerConfig, ParamGroups,
    ScheduleParams, SgdConfig,
};

use crate::args::{OptimizerKind, TrainArgs};

/// The optimizer named by `--optimizer`, with `--lr`, `--momentum`, `--weight-decay`, for
/// parameters of `dtype` on `device`: the CPU rule over a flat master copy on the CPU, the
/// multi-tensor CUDA kernels (the same rule, in place) on a GPU; with `--offload-optimizer` the
/// CPU rule in fp32 for a model on a GPU.
pub fn build_optimizer(args: &TrainArgs, device: &Device, dtype: DType) -> Result<ModelOptimizer> {
    let config = match args.optimizer {
        OptimizerKind::Sgd => OptimizerConfig::Sgd(SgdConfig {
            lr: args.lr,
            momentum: args.momentum,
            weight_decay: args.weight_decay,
            ..SgdConfig::default()
        }),
        OptimizerKind::Adamw => OptimizerConfig::AdamW(AdamWConfig {
            lr: args.lr,
            weight_decay: args.weight_decay,
            ..AdamWConfig::default()
        }),
    };
    // Offloaded: the optimizer is built for the host, in fp32, whatever the model's device.
    let (device, dtype) = match args.offload_optimizer {
        true if !device.is_cuda() => {
            bail!("--offload-optimizer: the model is on the CPU already (offload is for GPUs)")
        }
        true => (&Device::Cpu, DType::F32),
        false => (device, dtype),
    };
    Ok(ModelOptimizer::new(
        config,
        ParamGroups::default(),
        device,
        dtype,
    )?)
}
/// The schedule named by `--lr-schedule` over `total_steps`, with `--warmup-steps` of linear warm-up.
pub fn build_schedule(args: &TrainArgs, total_steps: usize) -> Result<Box<dyn LrSchedule>> {
    let params = ScheduleParams {
        base_lr: args.lr,
        total_steps,
        warmup_steps: args.warmup_steps,
        // `step`: decay by 10x after each third of the run.
        step_size: (total_steps / 3).max(1),
        ..ScheduleParams::default()
    };
    Ok(schedule_from_name(&args.lr_schedule, &params)?)
}
