//! Learning-rate schedules with PyTorch's closed-form semantics. Each is a pure function of
//! the step index, so resuming from a checkpoint at step `n` gives exactly the same rates.

use std::f64::consts::PI;
use std::fmt::Debug;

use crate::{validate, OptimError};

/// A learning rate as a function of the step (or epoch) index, counted from 0.
pub trait LrSchedule: Debug + Send + Sync {
    fn lr_at(&self, step: usize) -> f64;
}

/// The same rate at every step.
#[derive(Debug, Clone, PartialEq)]
pub struct Constant {
    lr: f64,
}

impl Constant {
    pub fn new(lr: f64) -> Result<Self, OptimError> {
        validate::non_negative("Constant", "lr", lr)?;
        Ok(Self { lr })
    }
}

impl LrSchedule for Constant {
    fn lr_at(&self, _step: usize) -> f64 {
        self.lr
    }
}

/// `torch.optim.lr_scheduler.StepLR`: `base_lr * gamma^(step / step_size)` (integer division).
#[derive(Debug, Clone, PartialEq)]
pub struct StepLr {
    base_lr: f64,
    step_size: usize,
    gamma: f64,
}

impl StepLr {
    pub fn new(base_lr: f64, step_size: usize, gamma: f64) -> Result<Self, OptimError> {
        validate::non_negative("StepLr", "base_lr", base_lr)?;
        validate::positive_count("StepLr", "step_size", step_size)?;
        validate::non_negative("StepLr", "gamma", gamma)?;
        Ok(Self {
            base_lr,
            step_size,
            gamma,
        })
    }
}

impl LrSchedule for StepLr {
    fn lr_at(&self, step: usize) -> f64 {
        self.base_lr * self.gamma.powf((step / self.step_size) as f64)
    }
}

/// `torch.optim.lr_scheduler.MultiStepLR`: `base_lr * gamma^k` where `k` counts the milestones
/// `<= step` (a repeated milestone counts each time, as in PyTorch).
#[derive(Debug, Clone, PartialEq)]
pub struct MultiStepLr {
    base_lr: f64,
    milestones: Vec<usize>,
    gamma: f64,
}

impl MultiStepLr {
    /// `milestones` may be given in any order.
    pub fn new(base_lr: f64, mut milestones: Vec<usize>, gamma: f64) -> Result<Self, OptimError> {
        validate::non_negative("MultiStepLr", "base_lr", base_lr)?;
        validate::non_negative("MultiStepLr", "gamma", gamma)?;
        milestones.sort_unstable();
        Ok(Self {
            base_lr,
            milestones,
            gamma,
        })
    }
}

impl LrSchedule for MultiStepLr {
    fn lr_at(&self, step: usize) -> f64 {
        let passed = self
            .milestones
            .partition_point(|&milestone| milestone <= step);
        self.base_lr * self.gamma.powf(passed as f64)
    }
}

/// `torch.optim.lr_scheduler.CosineAnnealingLR` in closed form:
/// `eta_min + (base_lr - eta_min) * (1 + cos(pi * step / t_max)) / 2`. As in PyTorch, past
/// `t_max` the cosine keeps going (the rate rises again towards `base_lr` at `2 * t_max`).
#[derive(Debug, Clone, PartialEq)]
pub struct CosineAnnealing {
    base_lr: f64,
    t_max: usize,
    eta_min: f64,
}

impl CosineAnnealing {
    pub fn new(base_lr: f64, t_max: usize, eta_min: f64) -> Result<Self, OptimError> {
        validate::non_negative("CosineAnnealing", "base_lr", base_lr)?;
        validate::positive_count("CosineAnnealing", "t_max", t_max)?;
        validate::non_negative("CosineAnnealing", "eta_min", eta_min)?;
        Ok(Self {
            base_lr,
            t_max,
            eta_min,
        })
    }
}

impl LrSchedule for CosineAnnealing {
    fn lr_at(&self, step: usize) -> f64 {
        let cosine = (PI * step as f64 / self.t_max as f64).cos();
        self.eta_min + (self.base_lr - self.eta_min) * (1.0 + cosine) / 2.0
    }
}

/// Linear warmup into another schedule: `torch.optim.lr_scheduler.LinearLR(start_factor,
/// total_iters=warmup_steps)` followed, via `SequentialLR(milestones=[warmup_steps])`, by
/// `inner`. For `step < warmup_steps` the rate is
/// `inner.lr_at(0) * (start_factor + (1 - start_factor) * step / warmup_steps)`; from
/// `warmup_steps` on it is `inner.lr_at(step - warmup_steps)`.
#[derive(Debug)]
pub struct LinearWarmup {
    warmup_steps: usize,
    start_factor: f64,
    inner: Box<dyn LrSchedule>,
}

impl LinearWarmup {
    /// `start_factor` must lie in `(0, 1]` (as PyTorch requires); `warmup_steps` may be 0,
    /// which leaves `inner` unchanged.
    pub fn new(
        warmup_steps: usize,
        start_factor: f64,
        inner: Box<dyn LrSchedule>,
    ) -> Result<Self, OptimError> {
        if !(start_factor > 0.0 && start_factor <= 1.0) {
            return Err(validate::invalid(
                "LinearWarmup",
                "start_factor",
                start_factor.to_string(),
                "in (0, 1]",
            ));
        }
        Ok(Self {
            warmup_steps,
            start_factor,
            inner,
        })
    }
}

impl LrSchedule for LinearWarmup {
    fn lr_at(&self, step: usize) -> f64 {
        if step >= self.warmup_steps {
            return self.inner.lr_at(step - self.warmup_steps);
        }
        let ramp = (1.0 - self.start_factor) * step as f64 / self.warmup_steps as f64;
        self.inner.lr_at(0) * (self.start_factor + ramp)
    }
}
