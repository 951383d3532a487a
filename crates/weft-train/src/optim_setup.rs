//! Building the optimizer and learning-rate schedule from the trainer's flags.

use anyhow::Result;
use candle_core::Device;
use weft_optim::{
    schedule_from_name, AdamW, AdamWConfig, LrSchedule, ScheduleParams, Sgd, SgdConfig, TensorSgd,
};

use crate::args::{OptimizerKind, TrainArgs};
use weft_optim::ModelOptimizer;

/// The optimizer named by `--optimizer`, with `--lr`, `--momentum`, `--weight-decay`, for
/// parameters on `device`: SGD on a GPU runs as tensor operations there.
pub fn build_optimizer(args: &TrainArgs, device: &Device) -> Result<ModelOptimizer> {
    Ok(match args.optimizer {
        OptimizerKind::Sgd => {
            let config = SgdConfig {
                lr: args.lr,
                momentum: args.momentum,
                weight_decay: args.weight_decay,
                ..SgdConfig::default()
            };
            if device.is_cpu() {
                ModelOptimizer::F32(Box::new(Sgd::new(config)?))
            } else {
                ModelOptimizer::Tensor(TensorSgd::new(config)?)
            }
        }
        OptimizerKind::Adamw => ModelOptimizer::F32(Box::new(AdamW::new(AdamWConfig {
            lr: args.lr,
            weight_decay: args.weight_decay,
            ..AdamWConfig::default()
        })?)),
    })
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
