//! The step engine assembled in one place: a model, its objective and the step's settings —
//! the optimizer (on the device, or offloaded with its optional delayed update), precision
//! (loss scaling where the policy needs it), recomputation and gradient clipping — as a
//! [`Trainer`], for the trainers, the benches and gpu-check alike. A trainer's `parallelize`
//! then gives it its strategy.

use anyhow::{bail, Result};
use weft_parallel::Trainer;
use weft_precision::{DynamicLossScaler, PrecisionPolicy, ScalerConfig};
use weft_tensor::{BlockModel, Objective};

use crate::flags::{LrScheduleName, OptimizerKind, Recompute};
use crate::optim_setup::{build_optimizer, OptimizerSettings};

/// What a training step is made of besides the model and its objective.
#[derive(Debug, Clone)]
pub struct StepSettings {
    pub optimizer: OptimizerSettings,
    pub policy: PrecisionPolicy,
    pub recompute: Recompute,
    /// Clip the gradients' global norm to this.
    pub clip_grad_norm: Option<f64>,
}

impl StepSettings {
    /// `optimizer` under `policy`: no recomputation, no clipping.
    pub fn new(optimizer: OptimizerSettings, policy: PrecisionPolicy) -> Self {
        Self {
            optimizer,
            policy,
            recompute: Recompute::None,
            clip_grad_norm: None,
        }
    }
}

impl OptimizerSettings {
    /// AdamW at a constant `lr` (PyTorch's betas and eps), on the device.
    pub fn adamw(lr: f64, weight_decay: f64) -> Self {
        Self::constant(OptimizerKind::Adamw, lr, 0.0, weight_decay)
    }

    /// SGD at a constant `lr`, on the device.
    pub fn sgd(lr: f64, momentum: f64, weight_decay: f64) -> Self {
        Self::constant(OptimizerKind::Sgd, lr, momentum, weight_decay)
    }

    fn constant(optimizer: OptimizerKind, lr: f64, momentum: f64, weight_decay: f64) -> Self {
        Self {
            optimizer,
            lr,
            momentum,
            weight_decay,
            offload_optimizer: false,
            delayed_update_from: None,
            lr_schedule: LrScheduleName::Constant,
            warmup_steps: 0,
        }
    }
}

/// `model`'s training step for `objective` with `settings`, on the model's device.
pub fn assemble(
    model: BlockModel,
    objective: Box<dyn Objective>,
    settings: &StepSettings,
) -> Result<Trainer> {
    let device = model.store().device().clone();
    let optimizer = build_optimizer(
        &settings.optimizer,
        &device,
        settings.policy.updated_dtype(),
    )?;
    let checkpointing = settings.recompute.plan(&model);
    let mut trainer = Trainer::new(model, objective, optimizer, checkpointing)?;
    if let Some(max_norm) = settings.clip_grad_norm {
        trainer = trainer.with_clip_grad_norm(max_norm)?;
    }
    if settings.policy.needs_loss_scaling() {
        trainer = trainer.with_loss_scaler(DynamicLossScaler::new(ScalerConfig::default())?);
    }
    if let Some(from) = settings.optimizer.delayed_update_from {
        if !settings.optimizer.offload_optimizer {
            bail!("--delayed-update-from overlaps an offloaded step: it needs --offload-optimizer");
        }
        trainer = trainer.with_delayed_update(from)?;
    }
    Ok(trainer)
}
