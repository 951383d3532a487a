//! Building the optimizer and learning-rate schedule from the flags the trainers share.

use anyhow::{bail, Result};
use candle_core::{DType, Device};
use weft_optim::{
    schedule_from_name, AdamWConfig, LrSchedule, ModelOptimizer, OptimizerConfig, ParamGroups,
    ScheduleParams, SgdConfig,
};

use crate::flags::{LrScheduleName, OptimizerKind};

/// A run's optimizer and schedule, resolved from its flags
/// ([`crate::flags::OptimizerFlags::settings`]).
#[derive(Debug, Clone)]
pub struct OptimizerSettings {
    pub optimizer: OptimizerKind,
    pub lr: f64,
    pub momentum: f64,
    pub weight_decay: f64,
    pub offload_optimizer: bool,
    pub delayed_update_from: Option<u64>,
    pub lr_schedule: LrScheduleName,
    pub warmup_steps: usize,
}

/// The optimizer named by `--optimizer`, with `--lr`, `--momentum`, `--weight-decay`, for
/// parameters of `dtype` on `device`: the CPU rule over a flat master copy on the CPU, the
/// multi-tensor CUDA kernels (the same rule, in place) on a GPU; with `--offload-optimizer` the
/// CPU rule in fp32 for a model on a GPU.
pub fn build_optimizer(
    args: &OptimizerSettings,
    device: &Device,
    dtype: DType,
) -> Result<ModelOptimizer> {
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
pub fn build_schedule(args: &OptimizerSettings, total_steps: usize) -> Result<Box<dyn LrSchedule>> {
    let params = ScheduleParams {
        base_lr: args.lr,
        total_steps,
        warmup_steps: args.warmup_steps,
        // `step`: decay by 10x after each third of the run.
        step_size: (total_steps / 3).max(1),
        ..ScheduleParams::default()
    };
    Ok(schedule_from_name(args.lr_schedule.name(), &params)?)
}
