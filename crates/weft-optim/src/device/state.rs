//! What a [`DeviceOptimizer`] keeps besides its rule: the state buffers and, for 16-bit
//! parameters, the fp32 master weights over the stepped range — read by name for checkpoints,
//! loaded from one, and the master copy made from the parameters at the first step.

use std::ops::Range;

use candle_core::{DType, Tensor};
use weft_tensor::{FlatBuffer, ParamStore};

use super::{tensor_error, DeviceOptimizer, MASTER_WEIGHTS};
use crate::OptimError;

impl DeviceOptimizer {
    /// The state buffers by name, each over the stepped range (empty before the first step).
    pub fn state(&self) -> Vec<(&'static str, &Tensor)> {
        self.rule
            .buffer_names()
            .iter()
            .copied()
            .zip(&self.state)
            .collect()
    }

    /// The fp32 master weights it keeps for 16-bit parameters, over the stepped range.
    pub fn master(&self) -> Option<&Tensor> {
        self.master.as_ref().map(|(t, _)| t)
    }

    /// Bytes of the fp32 master weights it keeps for 16-bit parameters (0 otherwise).
    pub fn master_bytes(&self) -> usize {
        self.master
            .as_ref()
            .map_or(0, |(t, _)| t.elem_count() * t.dtype().size_in_bytes())
    }

    /// Replaces the state: buffers by name over `range` (on any device; moved to the
    /// parameters'), and the step count. A buffer named [`MASTER_WEIGHTS`] replaces the fp32
    /// master weights of 16-bit parameters (taken as the master copy at the next step).
    pub fn load_state(
        &mut self,
        range: Range<usize>,
        step: u64,
        buffers: Vec<(String, Tensor)>,
    ) -> Result<(), OptimError> {
        let names = self.rule.buffer_names();
        let optimizer = self.rule.name();
        let mut state = Vec::with_capacity(names.len());
        for &name in names {
            let Some((_, t)) = buffers.iter().find(|(n, _)| n == name) else {
                if step == 0 {
                    break;
                }
                return Err(OptimError::MissingStateBuffer {
                    optimizer,
                    buffer: name,
                    step,
                });
            };
            check_len(optimizer, name, t, &range)?;
            let on_device = t
                .flatten_all()
                .and_then(|t| t.to_device(&self.device)?.copy())
                .map_err(tensor_error(optimizer))?;
            state.push(on_device);
        }
        let master = buffers.iter().find(|(n, _)| n == MASTER_WEIGHTS);
        if let Some((_, t)) = master {
            check_len(optimizer, MASTER_WEIGHTS, t, &range)?;
        }
        let loaded_master = master
            .map(|(_, t)| {
                t.flatten_all()
                    .and_then(|t| t.to_dtype(DType::F32)?.to_device(&self.device)?.copy())
            })
            .transpose()
            .map_err(tensor_error(optimizer))?;
        if let Some(extra) = buffers
            .iter()
            .find(|(n, _)| !names.contains(&n.as_str()) && n != MASTER_WEIGHTS)
        {
            return Err(OptimError::UnexpectedStateBuffer {
                optimizer,
                buffer: extra.0.clone(),
                expected: names.to_vec(),
            });
        }
        let step_value =
            Tensor::new(&[step as f64, 0.0, 0.0], &self.device).map_err(tensor_error(optimizer))?;
        self.step_value = Some(step_value);
        self.state = state;
        self.issued = step;
        self.master = None;
        self.loaded_master = loaded_master;
        self.range = Some(range);
        Ok(())
    }
}

/// A loaded buffer must cover the stepped range, element for element.
fn check_len(
    optimizer: &'static str,
    buffer: &'static str,
    t: &Tensor,
    range: &Range<usize>,
) -> Result<(), OptimError> {
    match t.elem_count() == range.len() {
        true => Ok(()),
        false => Err(OptimError::StateLengthMismatch {
            optimizer,
            buffer,
            state: t.elem_count(),
            params: range.len(),
        }),
    }
}

/// 16-bit parameters with fp32 gradients: updated through fp32 master weights.
pub(super) fn is_mixed(param: DType, grads: DType) -> bool {
    matches!(param, DType::BF16 | DType::F16) && grads == DType::F32
}

/// The fp32 master weights over `range` for 16-bit parameters with fp32 gradients (their
/// exact values, widened), `None` when parameters and gradients share a dtype. Written part by
/// part into one buffer: at most one parameter's widened copy exists beside it (parts made
/// first and concatenated took twice the copy's size, freed into the memory pool in pieces
/// that the first step's moments could not use: 14 GiB more of the device for Phi-3-mini).
/// `loaded` (a checkpoint's master weights over `range`) is taken as it is, none made beside it
/// (a resumed run's first step would hold the copy twice).
pub(super) fn master_weights(
    grads: &FlatBuffer,
    store: &ParamStore,
    range: &Range<usize>,
    loaded: Option<Tensor>,
) -> candle_core::Result<Option<(Tensor, DType)>> {
    let mut parts = Vec::new();
    for slot in grads.layout().slots() {
        let (start, end) = (
            slot.offset.max(range.start),
            (slot.offset + slot.numel()).min(range.end),
        );
        if start >= end {
            continue;
        }
        // Detached: a copy made from the variable would keep it alive through Candle's graph.
        let param = store.entries()[slot.entry].tensor().detach();
        if !is_mixed(param.dtype(), grads.dtype()) {
            return Ok(None);
        }
        parts.push((param, start - slot.offset, end - start, start - range.start));
    }
    let Some(dtype) = parts.first().map(|(param, ..)| param.dtype()) else {
        return Ok(None);
    };
    if let Some(loaded) = loaded {
        return Ok(Some((loaded, dtype)));
    }
    let master = Tensor::zeros(range.len(), DType::F32, grads.tensor().device())?;
    for (param, from, len, at) in parts {
        let part = param.flatten_all()?.narrow(0, from, len)?;
        master.slice_set(&part.to_dtype(DType::F32)?, 0, at)?;
    }
    Ok(Some((master, dtype)))
}
