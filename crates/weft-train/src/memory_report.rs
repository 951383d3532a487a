//! The per-rank memory table a trainer prints after its first step: the model states the
//! trainer holds, counted from its tensors, beside what `memory_plan` predicts for the run.

use anyhow::Result;
use weft_parallel::Trainer;
use weft_precision::PrecisionPolicy;

use crate::args::{OptimizerKind, TrainArgs};
use crate::memory_plan::{self, Device, PlanSettings, PlannedOptimizer};

/// The plan's settings for this run of `world` ranks.
pub fn plan_settings(args: &TrainArgs, policy: PrecisionPolicy, world: usize) -> PlanSettings {
    PlanSettings {
        device: match args.device.starts_with("cuda") {
            true => Device::Cuda,
            false => Device::Cpu,
        },
        world,
        zero: args.zero,
        offload_optimizer: args.offload_optimizer,
        tp: 1,
        pp: 1,
        precision: policy,
        optimizer: match args.optimizer {
            OptimizerKind::Sgd => PlannedOptimizer::Sgd {
                momentum: args.momentum != 0.0,
            },
            OptimizerKind::Adamw => PlannedOptimizer::AdamW,
        },
        batch_size: (args.batch_size / world.max(1)).max(1),
        checkpoint_activations: false,
        grad_dtype: None,
        state_dtype: None,
    }
}

/// Measured against planned model states of this rank, one line per category.
pub fn model_state_table(trainer: &Trainer, settings: &PlanSettings) -> Result<String> {
    let params = trainer.model().store().num_parameters() as u64;
    let planned = memory_plan::model_states(settings, params)?;
    let measured = trainer.model_state_bytes().by_category();
    let mib = |b: f64| b / (1u64 << 20) as f64;
    let mut table = format!(
        "{:<18} {:>12} {:>12}\n",
        "model state", "measured", "planned"
    );
    for ((category, got), (_, want)) in measured.iter().zip(planned) {
        table += &format!(
            "{category:<18} {:>8.2} MiB {:>8.2} MiB\n",
            mib(*got as f64),
            mib(want as f64)
        );
    }
    Ok(table)
}
