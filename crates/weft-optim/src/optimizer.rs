//! The `Optimizer` trait: one fused update over a flat parameter buffer, plus learning-rate
//! access and state export/import for checkpoints.

use crate::{OptimError, OptimizerState, Real};

/// An optimizer that updates a flat buffer of parameters in place from a flat buffer of
/// gradients of the same length. Stepping disjoint pieces of a buffer with separate
/// optimizers gives exactly the same result as stepping the whole buffer with one, which is
/// what a sharded (ZeRO) optimizer relies on.
pub trait Optimizer<T: Real = f32> {
    /// Applies one update. State buffers are created (zeroed) at the first step, sized to
    /// `params.len()`; afterwards every step must pass buffers of that length. On error
    /// nothing (params, state, step count) is modified.
    fn step(&mut self, params: &mut [T], grads: &[T]) -> Result<(), OptimError> {
        self.step_at(Shard::whole(params.len()), params, grads)
    }
    /// [`Optimizer::step`] of one shard of the flat buffer the param groups are defined over
    /// (ZeRO): the groups, checked against the whole buffer, are clipped to the shard and
    /// re-based ([`crate::ParamGroups::restricted_to`]).
    fn step_at(&mut self, shard: Shard, params: &mut [T], grads: &[T]) -> Result<(), OptimError>;
    /// The base learning rate (param groups scale it per range).
    fn lr(&self) -> f64;
    /// Sets the base learning rate, e.g. from an `LrSchedule`; it must be finite and `>= 0`.
    fn set_lr(&mut self, lr: f64) -> Result<(), OptimError>;
    /// Number of steps taken.
    fn step_count(&self) -> u64;
    /// Total number of elements held across all state buffers (0 before the first step).
    fn state_len(&self) -> usize;
    /// A copy of the state, for checkpoints.
    fn state(&self) -> OptimizerState<T>;
    /// Replaces the state with one exported by `state` from an optimizer of the same kind
    /// and configuration. On error the current state is kept.
    fn load_state(&mut self, state: OptimizerState<T>) -> Result<(), OptimError>;
}

/// Where the slice an optimizer steps lies in the flat buffer its param groups cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// Index of the slice's first element in the buffer.
    pub offset: usize,
    /// Elements in the whole buffer.
    pub buffer_len: usize,
}

impl Shard {
    /// The whole buffer of `len` elements.
    pub fn whole(len: usize) -> Self {
        Self {
            offset: 0,
            buffer_len: len,
        }
    }
}

/// Checks that `grads` and every existing state buffer (`(name, len)`) match `params_len`.
pub(crate) fn check_step_lengths(
    optimizer: &'static str,
    params_len: usize,
    grads_len: usize,
    state_buffers: &[(&'static str, usize)],
) -> Result<(), OptimError> {
    if grads_len != params_len {
        return Err(OptimError::LengthMismatch {
            params: params_len,
            grads: grads_len,
        });
    }
    match state_buffers.iter().find(|(_, len)| *len != params_len) {
        Some(&(buffer, state)) => Err(OptimError::StateLengthMismatch {
            optimizer,
            buffer,
            state,
            params: params_len,
        }),
        None => Ok(()),
    }
}
