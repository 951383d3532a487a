//! An optimizer's state by parameter name, for checkpoints: for every parameter and every
//! state buffer (`momentum_buffer`, `exp_avg`, `exp_avg_sq`, `max_exp_avg_sq`) the buffer's
//! values for that parameter, shaped like it, plus the step count — PyTorch's
//! `optimizer.state_dict()["state"]`, keyed by name instead of by index. Loading checks every
//! parameter, buffer and shape before anything is replaced.

use std::ops::Range;

use candle_core::{DType, Device, Tensor};
use weft_tensor::{FlatLayout, Slot};

use crate::{ModelOptimizer, OptimError, OptimizerState};

/// One parameter's part of one state buffer.
#[derive(Debug, Clone)]
pub struct NamedStateEntry {
    pub parameter: String,
    pub buffer: String,
    /// On the CPU, in the state's dtype, shaped like the parameter.
    pub values: Tensor,
}

/// An optimizer's state by parameter name.
#[derive(Debug, Clone)]
pub struct NamedState {
    /// Which optimizer saved it (`sgd`, `adamw`).
    pub optimizer: String,
    /// Steps taken.
    pub step: u64,
    pub entries: Vec<NamedStateEntry>,
}

/// An optimizer's state as flat buffers over its range, on the CPU (a ZeRO shard's, in a
/// sharded checkpoint).
#[derive(Debug, Clone)]
pub struct FlatState {
    /// Which optimizer saved it (`sgd`, `adamw`).
    pub optimizer: String,
    /// Steps taken.
    pub step: u64,
    /// Each state buffer by name, 1-D over the range.
    pub buffers: Vec<(String, Tensor)>,
}

fn invalid(parameter: &str, buffer: &str, reason: impl Into<String>) -> OptimError {
    OptimError::NamedState {
        parameter: parameter.into(),
        buffer: buffer.into(),
        reason: reason.into(),
    }
}

fn tensor_error(e: candle_core::Error) -> OptimError {
    OptimError::Tensor {
        optimizer: "named state",
        reason: e.to_string(),
    }
}

/// The slots of `layout` inside `range` (an optimizer's state covers whole parameters).
fn slots_in<'a>(layout: &'a FlatLayout, range: &Range<usize>) -> Result<Vec<&'a Slot>, OptimError> {
    let mut slots = Vec::new();
    for slot in layout.slots() {
        let r = slot.range();
        if r.end <= range.start || r.start >= range.end {
            continue;
        }
        if r.start < range.start || r.end > range.end {
            return Err(invalid(
                &slot.name,
                "*",
                format!("the state's range {range:?} cuts the parameter ({r:?})"),
            ));
        }
        slots.push(slot);
    }
    Ok(slots)
}

impl ModelOptimizer {
    /// The state over `range` of the flat buffers laid out by `layout`, by parameter name.
    pub fn named_state(
        &self,
        layout: &FlatLayout,
        range: Range<usize>,
    ) -> Result<NamedState, OptimError> {
        let slots = slots_in(layout, &range)?;
        let FlatState {
            optimizer,
            step,
            buffers,
        } = self.flat_state(range.len())?;
        let mut entries = Vec::new();
        for slot in slots {
            for (buffer, values) in &buffers {
                let part = values
                    .narrow(0, slot.offset - range.start, slot.numel())
                    .and_then(|t| t.reshape(slot.shape.as_slice()))
                    .map_err(tensor_error)?;
                entries.push(NamedStateEntry {
                    parameter: slot.name.clone(),
                    buffer: buffer.clone(),
                    values: part,
                });
            }
        }
        Ok(NamedState {
            optimizer,
            step,
            entries,
        })
    }

    /// Replaces the state over `range` with `state`: every parameter in the range must have
    /// an entry for every buffer the state holds, of its shape; nothing is replaced otherwise.
    pub fn load_named_state(
        &mut self,
        layout: &FlatLayout,
        range: Range<usize>,
        state: &NamedState,
    ) -> Result<(), OptimError> {
        let slots = slots_in(layout, &range)?;
        let mut buffers: Vec<String> = state.entries.iter().map(|e| e.buffer.clone()).collect();
        buffers.sort();
        buffers.dedup();
        if let Some(stray) = state
            .entries
            .iter()
            .find(|e| !slots.iter().any(|s| s.name == e.parameter))
        {
            return Err(invalid(
                &stray.parameter,
                &stray.buffer,
                "no such parameter in the optimizer's range",
            ));
        }
        let dtype = match self.dtype() {
            Some(dtype) => dtype,
            None => state
                .entries
                .first()
                .map_or(DType::F32, |e| e.values.dtype()),
        };
        let mut flat = Vec::with_capacity(buffers.len());
        for buffer in &buffers {
            let mut parts = Vec::with_capacity(slots.len());
            for slot in &slots {
                let entry = state
                    .entries
                    .iter()
                    .find(|e| e.parameter == slot.name && &e.buffer == buffer)
                    .ok_or_else(|| invalid(&slot.name, buffer, "missing"))?;
                if entry.values.dims() != slot.shape.as_slice() {
                    return Err(invalid(
                        &slot.name,
                        buffer,
                        format!(
                            "shape {:?}, the parameter's is {:?}",
                            entry.values.dims(),
                            slot.shape
                        ),
                    ));
                }
                parts.push(
                    entry
                        .values
                        .to_device(&Device::Cpu)
                        .and_then(|t| t.to_dtype(dtype)?.flatten_all())
                        .map_err(tensor_error)?,
                );
            }
            let joined = match parts.is_empty() {
                true => Tensor::zeros(0, dtype, &Device::Cpu),
                false => Tensor::cat(&parts, 0),
            }
            .map_err(tensor_error)?;
            flat.push((buffer.clone(), joined));
        }
        self.load_flat_state(&state.optimizer, state.step, range, flat)
    }

    /// The optimizer's name, step count and state buffers (flat, on the CPU, `len` long: the
    /// range it steps).
    pub fn flat_state(&self, len: usize) -> Result<FlatState, OptimError> {
        fn host<T: candle_core::WithDType>(
            state: OptimizerState<T>,
            len: usize,
        ) -> Result<FlatState, OptimError> {
            if let Some((name, values)) = state.buffers.iter().find(|(_, v)| v.len() != len) {
                return Err(invalid(
                    "*",
                    name,
                    format!("the state has {} elements, the range {len}", values.len()),
                ));
            }
            let buffers = state
                .buffers
                .into_iter()
                .map(|(name, values)| Ok((name, Tensor::from_vec(values, len, &Device::Cpu)?)))
                .collect::<candle_core::Result<_>>()
                .map_err(tensor_error)?;
            Ok(FlatState {
                optimizer: state.optimizer,
                step: state.step,
                buffers,
            })
        }
        match self {
            ModelOptimizer::F32(opt) => host(opt.state(), len),
            ModelOptimizer::F64(opt) => host(opt.state(), len),
            #[cfg(feature = "cuda")]
            ModelOptimizer::Device(opt) => {
                let master = opt.master().map(|m| (crate::device::MASTER_WEIGHTS, m));
                let buffers = opt
                    .state()
                    .into_iter()
                    .chain(master)
                    .map(|(name, t)| Ok((name.to_string(), t.to_device(&Device::Cpu)?)))
                    .collect::<candle_core::Result<_>>()
                    .map_err(tensor_error)?;
                Ok(FlatState {
                    optimizer: opt.optimizer_name().into(),
                    step: opt.step_count()?,
                    buffers,
                })
            }
        }
    }

    /// Replaces the state with flat buffers over `range` (on the CPU), as
    /// [`Self::flat_state`] gives them.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    pub fn load_flat_state(
        &mut self,
        optimizer: &str,
        step: u64,
        range: Range<usize>,
        buffers: Vec<(String, Tensor)>,
    ) -> Result<(), OptimError> {
        fn host<T: candle_core::WithDType>(
            optimizer: &str,
            step: u64,
            buffers: Vec<(String, Tensor)>,
        ) -> Result<OptimizerState<T>, OptimError> {
            let buffers = buffers
                .into_iter()
                .map(|(name, t)| Ok((name, t.to_vec1::<T>()?)))
                .collect::<candle_core::Result<_>>()
                .map_err(tensor_error)?;
            Ok(OptimizerState {
                optimizer: optimizer.into(),
                step,
                buffers,
            })
        }
        match self {
            ModelOptimizer::F32(opt) => opt.load_state(host(optimizer, step, buffers)?),
            ModelOptimizer::F64(opt) => opt.load_state(host(optimizer, step, buffers)?),
            #[cfg(feature = "cuda")]
            ModelOptimizer::Device(opt) => {
                if optimizer != opt.optimizer_name() {
                    return Err(OptimError::StateKindMismatch {
                        expected: opt.optimizer_name(),
                        found: optimizer.into(),
                    });
                }
                opt.load_state(range, step, buffers)
            }
        }
    }
}
