//! The error type of weft-optim: every failure names the optimizer, field, buffer or range it concerns.

use std::ops::Range;

/// Errors raised by the optimizers, their parameter groups, state checkpoints and LR schedules.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptimError {
    #[error("params has {params} elements but grads has {grads}")]
    LengthMismatch { params: usize, grads: usize },
    /// A tensor operation of a tensor optimizer failed (dtype, device or shape).
    #[error("{optimizer}: tensor operation failed: {reason}")]
    Tensor {
        optimizer: &'static str,
        reason: String,
    },
    #[error("{optimizer}: state buffer `{buffer}` has {state} elements but params has {params}")]
    StateLengthMismatch {
        optimizer: &'static str,
        buffer: &'static str,
        state: usize,
        params: usize,
    },
    #[error("{owner}: {field} = {value} is invalid: must be {requirement}")]
    InvalidHyperparameter {
        owner: &'static str,
        field: &'static str,
        value: String,
        requirement: &'static str,
    },
    #[error(
        "sgd: nesterov momentum requires momentum > 0 and dampening == 0, \
         got momentum = {momentum}, dampening = {dampening}"
    )]
    InvalidNesterov { momentum: f64, dampening: f64 },
    #[error("param group range {start}..{end} is reversed (start > end)")]
    ReversedGroupRange { start: usize, end: usize },
    #[error("param groups {first:?} and {second:?} overlap")]
    OverlappingGroups {
        first: Range<usize>,
        second: Range<usize>,
    },
    #[error("param group {range:?} reaches past the end of params (length {len})")]
    GroupOutOfBounds { range: Range<usize>, len: usize },
    #[error("optimizer state was saved by `{found}` but is being loaded into `{expected}`")]
    StateKindMismatch {
        expected: &'static str,
        found: String,
    },
    #[error("{optimizer}: state has unexpected buffer `{buffer}` (expected one of {expected:?})")]
    UnexpectedStateBuffer {
        optimizer: &'static str,
        buffer: String,
        expected: Vec<&'static str>,
    },
    #[error("{optimizer}: state at step {step} is missing buffer `{buffer}`")]
    MissingStateBuffer {
        optimizer: &'static str,
        buffer: &'static str,
        step: u64,
    },
    #[error(
        "{optimizer}: state at step 0 holds buffer `{buffer}`, \
         but buffers only exist after the first step"
    )]
    StateBufferBeforeFirstStep {
        optimizer: &'static str,
        buffer: &'static str,
    },
    #[error(
        "{optimizer}: state buffer `{buffer}` has {len} elements \
         but buffer `{first_buffer}` has {first_len}"
    )]
    StateBufferLengths {
        optimizer: &'static str,
        buffer: &'static str,
        len: usize,
        first_buffer: &'static str,
        first_len: usize,
    },
    #[error("optimizer state of `{parameter}`, buffer `{buffer}`: {reason}")]
    NamedState {
        parameter: String,
        buffer: String,
        reason: String,
    },
    #[error(
        "{optimizer}: the update's parts {parts:?} do not cover the range {range:?} once each"
    )]
    PartsNotCoveringRange {
        optimizer: &'static str,
        range: Range<usize>,
        parts: Vec<Range<usize>>,
    },
    #[error("unknown learning-rate schedule `{name}` (known: {known:?})")]
    UnknownSchedule {
        name: String,
        known: &'static [&'static str],
    },
}
