//! [`DynamicLossScaler`]: `torch.amp.GradScaler`'s dynamic loss scaling. Before backward the
//! loss is multiplied by the scale (2^16 to start), so gradients too small for fp16 (below
//! 2^-24) survive; before the optimizer they are divided by it again. A step whose gradients
//! hold an inf or NaN on any rank is skipped and the scale multiplied by the backoff factor
//! (0.5); after `growth_interval` (2000) consecutive clean steps it is multiplied by the growth
//! factor (2).

use serde::{Deserialize, Serialize};

use crate::error::PrecisionError;

/// GradScaler's settings, named and defaulted as in PyTorch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScalerConfig {
    pub init_scale: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: u64,
}

impl Default for ScalerConfig {
    fn default() -> Self {
        Self {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

/// What to do with the step whose gradients were just checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepDecision {
    /// Gradients are finite: take the optimizer step.
    Apply,
    /// An inf or NaN was found: skip the optimizer step (the scale was lowered).
    Skip,
}

/// The scaler's checkpointable state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LossScalerState {
    pub scale: f64,
    /// Consecutive clean steps since the scale last changed.
    pub growth_tracker: u64,
    /// Steps skipped so far.
    pub skipped_steps: u64,
}

/// Dynamic loss scaling with GradScaler's semantics.
#[derive(Debug, Clone)]
pub struct DynamicLossScaler {
    config: ScalerConfig,
    state: LossScalerState,
}

fn check(
    field: &'static str,
    value: f64,
    ok: bool,
    requirement: &'static str,
) -> Result<(), PrecisionError> {
    if ok {
        Ok(())
    } else {
        Err(PrecisionError::InvalidScaler {
            field,
            value: value.to_string(),
            requirement,
        })
    }
}

impl DynamicLossScaler {
    pub fn new(config: ScalerConfig) -> Result<Self, PrecisionError> {
        check(
            "init_scale",
            config.init_scale,
            config.init_scale.is_finite() && config.init_scale > 0.0,
            "finite and > 0",
        )?;
        check(
            "growth_factor",
            config.growth_factor,
            config.growth_factor.is_finite() && config.growth_factor > 1.0,
            "finite and > 1",
        )?;
        check(
            "backoff_factor",
            config.backoff_factor,
            config.backoff_factor > 0.0 && config.backoff_factor < 1.0,
            "in (0, 1)",
        )?;
        check(
            "growth_interval",
            config.growth_interval as f64,
            config.growth_interval > 0,
            "> 0",
        )?;
        let state = LossScalerState {
            scale: config.init_scale,
            growth_tracker: 0,
            skipped_steps: 0,
        };
        Ok(Self { config, state })
    }

    /// The factor the loss is multiplied by before backward.
    pub fn scale(&self) -> f64 {
        self.state.scale
    }

    /// The factor gradients are multiplied by to undo the scaling (computed in f64, as
    /// GradScaler computes `scale.double().reciprocal()`).
    pub fn inverse_scale(&self) -> f64 {
        1.0 / self.state.scale
    }

    /// Records the step's outcome: `found_inf` must already be reduced (max) over every rank
    /// holding part of the gradients. Lowers the scale and says `Skip` on an inf or NaN;
    /// otherwise counts a clean step and grows the scale after `growth_interval` of them.
    pub fn update(&mut self, found_inf: bool) -> StepDecision {
        if found_inf {
            self.state.scale *= self.config.backoff_factor;
            self.state.growth_tracker = 0;
            self.state.skipped_steps += 1;
            return StepDecision::Skip;
        }
        self.state.growth_tracker += 1;
        if self.state.growth_tracker == self.config.growth_interval {
            let grown = self.state.scale * self.config.growth_factor;
            // GradScaler keeps the scale when growing it would overflow.
            if grown.is_finite() {
                self.state.scale = grown;
            }
            self.state.growth_tracker = 0;
        }
        StepDecision::Apply
    }

    /// How the scale moves.
    pub fn config(&self) -> &ScalerConfig {
        &self.config
    }

    pub fn state(&self) -> &LossScalerState {
        &self.state
    }

    /// Restores a state saved by [`Self::state`].
    pub fn load_state(&mut self, state: LossScalerState) -> Result<(), PrecisionError> {
        check(
            "scale",
            state.scale,
            state.scale.is_finite() && state.scale > 0.0,
            "finite and > 0",
        )?;
        self.state = state;
        Ok(())
    }
}
