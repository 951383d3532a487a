//! Builds an LR schedule from its name and a flat set of parameters, as a training CLI would
//! (`--schedule cosine --warmup-steps 5`).

use crate::schedule::{Constant, CosineAnnealing, LinearWarmup, LrSchedule, MultiStepLr, StepLr};
use crate::{validate, OptimError};

/// The names [`schedule_from_name`] accepts.
pub const SCHEDULE_NAMES: &[&str] = &["constant", "step", "multistep", "cosine"];

/// Parameters for [`schedule_from_name`]; each schedule reads the fields it needs.
/// Steps of the named schedule are counted from the end of the warmup.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleParams {
    pub base_lr: f64,
    /// Length of the whole run, warmup included; `cosine` anneals over
    /// `total_steps - warmup_steps`.
    pub total_steps: usize,
    /// Linear warmup length; 0 for none.
    pub warmup_steps: usize,
    /// Fraction of `base_lr` at step 0 of the warmup.
    pub warmup_start_factor: f64,
    /// `step`: decay period.
    pub step_size: usize,
    /// `step`, `multistep`: decay factor.
    pub gamma: f64,
    /// `multistep`: steps at which the rate is multiplied by `gamma`.
    pub milestones: Vec<usize>,
    /// `cosine`: the final rate.
    pub eta_min: f64,
}

impl Default for ScheduleParams {
    /// PyTorch's defaults where it has them (`gamma` 0.1, `eta_min` 0, `start_factor` 1/3)
    /// and the classic ImageNet ResNet recipe otherwise (lr 0.1, decay every 30 epochs of 90).
    fn default() -> Self {
        Self {
            base_lr: 0.1,
            total_steps: 90,
            warmup_steps: 0,
            warmup_start_factor: 1.0 / 3.0,
            step_size: 30,
            gamma: 0.1,
            milestones: Vec::new(),
            eta_min: 0.0,
        }
    }
}

/// Builds the schedule called `name` (one of [`SCHEDULE_NAMES`]), wrapped in a
/// [`LinearWarmup`] when `params.warmup_steps > 0`.
pub fn schedule_from_name(
    name: &str,
    params: &ScheduleParams,
) -> Result<Box<dyn LrSchedule>, OptimError> {
    let schedule: Box<dyn LrSchedule> = match name {
        "constant" => Box::new(Constant::new(params.base_lr)?),
        "step" => Box::new(StepLr::new(params.base_lr, params.step_size, params.gamma)?),
        "multistep" => Box::new(MultiStepLr::new(
            params.base_lr,
            params.milestones.clone(),
            params.gamma,
        )?),
        "cosine" => {
            let anneal_steps = params
                .total_steps
                .checked_sub(params.warmup_steps)
                .filter(|&steps| steps > 0);
            let Some(t_max) = anneal_steps else {
                return Err(validate::invalid(
                    "cosine schedule",
                    "total_steps",
                    params.total_steps.to_string(),
                    "greater than warmup_steps",
                ));
            };
            Box::new(CosineAnnealing::new(params.base_lr, t_max, params.eta_min)?)
        }
        unknown => {
            return Err(OptimError::UnknownSchedule {
                name: unknown.to_owned(),
                known: SCHEDULE_NAMES,
            })
        }
    };
    if params.warmup_steps == 0 {
        return Ok(schedule);
    }
    Ok(Box::new(LinearWarmup::new(
        params.warmup_steps,
        params.warmup_start_factor,
        schedule,
    )?))
}
