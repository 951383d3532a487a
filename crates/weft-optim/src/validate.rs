//! Hyperparameter checks shared by the optimizer configs, parameter groups and LR schedules.

use crate::OptimError;

/// Accepts a finite `value >= 0`.
pub(crate) fn non_negative(
    owner: &'static str,
    field: &'static str,
    value: f64,
) -> Result<(), OptimError> {
    check(
        owner,
        field,
        value,
        value.is_finite() && value >= 0.0,
        "finite and >= 0",
    )
}

/// Accepts a finite `value` in `[0, 1)`.
pub(crate) fn unit_interval(
    owner: &'static str,
    field: &'static str,
    value: f64,
) -> Result<(), OptimError> {
    check(
        owner,
        field,
        value,
        (0.0..1.0).contains(&value),
        "in [0, 1)",
    )
}

/// Accepts any finite `value`.
pub(crate) fn finite(
    owner: &'static str,
    field: &'static str,
    value: f64,
) -> Result<(), OptimError> {
    check(owner, field, value, value.is_finite(), "finite")
}

/// Accepts `value > 0`.
pub(crate) fn positive_count(
    owner: &'static str,
    field: &'static str,
    value: usize,
) -> Result<(), OptimError> {
    if value > 0 {
        Ok(())
    } else {
        Err(invalid(owner, field, value.to_string(), "> 0"))
    }
}

pub(crate) fn invalid(
    owner: &'static str,
    field: &'static str,
    value: String,
    requirement: &'static str,
) -> OptimError {
    OptimError::InvalidHyperparameter {
        owner,
        field,
        value,
        requirement,
    }
}

fn check(
    owner: &'static str,
    field: &'static str,
    value: f64,
    ok: bool,
    requirement: &'static str,
) -> Result<(), OptimError> {
    if ok {
        Ok(())
    } else {
        Err(invalid(owner, field, value.to_string(), requirement))
    }
}
