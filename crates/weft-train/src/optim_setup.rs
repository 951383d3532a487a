//! Building the optimizer and learning-rate schedule from the trainer's flags.

use anyhow::Result;
use weft_optim::{
    schedule_from_name, AdamW, AdamWConfig, LrSchedule, ScheduleParams, Sgd, SgdConfig,
};

use crate::args::{OptimizerKind, TrainArgs};
use crate::step::FlatOptimizer;

/// The optimizer named by `--optimizer`, with `--lr`, `--momentum`, `--weight-decay`.
pub fn build_optimizer(args: &TrainArgs) -> Result<FlatOptimizer> {
    Ok(match args.optimizer {
        OptimizerKind::Sgd => FlatOptimizer::F32(Box::new(Sgd::new(SgdConfig {
            lr: args.lr,
            momentum: args.momentum,
            weight_decay: args.weight_decay,
            ..SgdConfig::default()
        })?)),
        OptimizerKind::Adamw => FlatOptimizer::F32(Box::new(AdamW::new(AdamWConfig {
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
