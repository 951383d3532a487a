//! The "Optimizer" section: the optimizer, its hyper-parameters and the learning-rate schedule.

use std::marker::PhantomData;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;

use super::TaskDefaults;
use crate::optim_setup::OptimizerSettings;

/// Which optimizer to train with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    Sgd,
    Adamw,
}

/// The learning rate's course over the run, after the warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LrScheduleName {
    /// The peak throughout.
    Constant,
    /// Divided by 10 after each third of the run.
    Step,
    /// Cosine decay to zero.
    Cosine,
}

impl LrScheduleName {
    /// The name weft-optim's `schedule_from_name` takes.
    pub fn name(self) -> &'static str {
        match self {
            LrScheduleName::Constant => "constant",
            LrScheduleName::Step => "step",
            LrScheduleName::Cosine => "cosine",
        }
    }
}

/// The optimizer, with PyTorch's update rules, and its schedule.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Optimizer")]
#[serde(rename_all = "kebab-case")]
pub struct OptimizerFlags<D: TaskDefaults> {
    /// sgd | adamw, with PyTorch's update rules
    #[arg(long, value_enum, default_value = D::OPTIMIZER)]
    pub optimizer: OptimizerKind,
    /// Peak learning rate, reached after the warm-up
    #[arg(long, default_value = D::LR)]
    pub lr: f64,
    /// SGD momentum (with --optimizer sgd)
    #[arg(long, default_value_t = 0.9)]
    pub momentum: f64,
    /// Weight decay on every parameter (AdamW's decoupled decay, SGD's L2 term)
    #[arg(long, default_value = D::WEIGHT_DECAY)]
    pub weight_decay: f64,
    /// constant | step | cosine
    #[arg(long, value_enum, default_value_t = LrScheduleName::Cosine)]
    pub lr_schedule: LrScheduleName,
    /// Steps of linear warm-up, fewer than the run's steps [default: none for train-resnet, a
    /// twentieth of the steps for train-gpt]
    #[arg(long)]
    pub warmup_steps: Option<usize>,
    /// Clip the gradients to this global norm before each optimizer step
    /// (torch.nn.utils.clip_grad_norm_; the norm over all ranks); logs `grad_norm` per step
    #[arg(long)]
    pub clip_grad_norm: Option<f64>,
    #[arg(skip)]
    #[serde(skip)]
    pub defaults: PhantomData<D>,
}

impl<D: TaskDefaults> OptimizerFlags<D> {
    /// Checks the values; the error is one line naming the flag.
    pub fn validate(&self) -> Result<()> {
        if !(self.lr.is_finite() && self.lr > 0.0) {
            bail!("--lr {} must be a positive number", self.lr);
        }
        if !(0.0..1.0).contains(&self.momentum) {
            bail!("--momentum {} must be in [0, 1)", self.momentum);
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            bail!("--weight-decay {} must be >= 0", self.weight_decay);
        }
        if let Some(max) = self.clip_grad_norm {
            if !(max.is_finite() && max > 0.0) {
                bail!("--clip-grad-norm {max} must be a positive number");
            }
        }
        Ok(())
    }

    /// The settings of a run of `total_steps`, the optimizer offloaded to the host or not
    /// (`--offload-optimizer`, `--delayed-update-from`); a warm-up not shorter than the run is
    /// refused.
    pub fn settings(
        &self,
        total_steps: usize,
        (offload_optimizer, delayed_update_from): (bool, Option<u64>),
    ) -> Result<OptimizerSettings> {
        let warmup_steps = self
            .warmup_steps
            .unwrap_or_else(|| D::warmup_steps(total_steps));
        if self.warmup_steps.is_some() && warmup_steps >= total_steps.max(1) {
            bail!("--warmup-steps {warmup_steps} must be fewer than the run's {total_steps} steps");
        }
        Ok(OptimizerSettings {
            optimizer: self.optimizer,
            lr: self.lr,
            momentum: self.momentum,
            weight_decay: self.weight_decay,
            offload_optimizer,
            delayed_update_from,
            lr_schedule: self.lr_schedule,
            warmup_steps,
        })
    }
}
