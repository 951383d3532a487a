//! The per-rank memory a trainer reports: after its first step the model states it holds,
//! counted from its tensors, beside what `memory_plan` predicts for the run, and the peak so
//! far; and the memory samples of every step as a log in the run folder.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use weft_parallel::{MemorySample, Trainer};
use weft_precision::PrecisionPolicy;

use crate::flags::{
    OptimizerFlags, OptimizerKind, ParallelFlags, Recompute, TaskDefaults, TrainingFlags,
};
use crate::memory_plan::{self, Device, PlanSettings, PlannedOptimizer};

/// The plan's settings for a run's flags, `world` being the ranks the model states are
/// divided over (the data-parallel replicas: a rank's own parameters are a tensor-parallel
/// slice or a pipeline stage already); `checkpointing` says whether the plan counts
/// `--checkpoint-activations` (it measures a CNN's activations, which it does not plan under
/// recomputation).
pub fn plan_settings<D: TaskDefaults>(
    (training, optim, parallel): (&TrainingFlags<D>, &OptimizerFlags<D>, &ParallelFlags),
    policy: PrecisionPolicy,
    world: usize,
    checkpointing: bool,
) -> PlanSettings {
    PlanSettings {
        device: match training.device.starts_with("cuda") {
            true => Device::Cuda,
            false => Device::Cpu,
        },
        world,
        zero: parallel.zero,
        offload_optimizer: parallel.offload_optimizer,
        tp: 1,
        pp: 1,
        precision: policy,
        optimizer: match optim.optimizer {
            OptimizerKind::Sgd => PlannedOptimizer::Sgd {
                momentum: optim.momentum != 0.0,
            },
            OptimizerKind::Adamw => PlannedOptimizer::AdamW,
        },
        batch_size: (training.batch_size / world.max(1)).max(1),
        checkpoint_activations: match checkpointing {
            true => training.checkpoint_activations,
            false => Recompute::None,
        },
        grad_dtype: None,
        state_dtype: None,
        bucket_cap_mb: parallel.bucket_cap_mb,
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

/// The memory samples of a run, one JSON line each, streamed to `memory-rank<R>.jsonl` in the
/// run folder as the steps go (a resumed run's file starts at its first step).
#[derive(Debug)]
pub struct MemoryLog {
    path: PathBuf,
    out: BufWriter<File>,
}

impl MemoryLog {
    /// Creates (or truncates) `RUN/memory-rank<rank>.jsonl`.
    pub fn create(run: &Path, rank: usize) -> Result<Self> {
        let path = run.join(format!("memory-rank{rank}.jsonl"));
        let file =
            File::create(&path).with_context(|| format!("{}: cannot create", path.display()))?;
        Ok(Self {
            path,
            out: BufWriter::new(file),
        })
    }

    /// Appends the samples of step `step` and flushes them to the file.
    pub fn push(&mut self, step: usize, samples: Vec<MemorySample>) -> Result<()> {
        for s in samples {
            let m = &s.model_states;
            let line = serde_json::json!({
                "step": step,
                "phase": s.phase,
                "parameters": m.parameters,
                "gradients": m.gradients,
                "master_weights": m.master_weights,
                "optimizer_states": m.optimizer_states,
                "activations": s.activations,
                "communication_buffers": s.communication_buffers,
                "total": s.total(),
                "device_tensors": s.device_tensors,
                "device_tensors_peak": s.device_tensors_peak,
                "device_reserved_peak": s.device_reserved_peak,
                "device_in_use": s.device_in_use,
                "workspaces": s.workspaces,
                "cuda_graph_pool": s.cuda_graph_pool,
            });
            writeln!(self.out, "{line}")
                .with_context(|| format!("{}: cannot write", self.path.display()))?;
        }
        self.out
            .flush()
            .with_context(|| format!("{}: cannot write", self.path.display()))
    }
}

/// One line on the peak: its total, its phase and what it held.
pub fn peak_line(peak: &MemorySample) -> String {
    let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
    let device = peak.device_in_use.map_or(String::new(), |b| {
        format!(", device in use {:.1} MiB", mib(b as usize))
    });
    let pool = match (peak.device_tensors_peak, peak.device_reserved_peak) {
        (Some(tensors), Some(reserved)) => format!(
            "; the pool's peaks so far: tensors {:.1} MiB, taken from the device {:.1} MiB",
            mib(tensors as usize),
            mib(reserved as usize)
        ),
        _ => String::new(),
    };
    format!(
        "memory peak so far: {:.2} MiB after {} (activations {:.2} MiB){device}",
        mib(peak.total()),
        peak.phase,
        mib(peak.activations)
    ) + &pool
}
