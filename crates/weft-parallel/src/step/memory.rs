//! [`ModelStateBytes`]: the model states a [`Trainer`] holds on this rank, counted from the
//! live tensors themselves (not from a formula): the model's parameters, the flat gradient
//! buffer, the master weights (the trainer's flat master copy, or the device optimizer's fp32
//! copy of 16-bit parameters) and the optimizer's state buffers. `memory-plan`'s model-state
//! rows are tested against these counts.

use super::Trainer;

/// Bytes of each model-state category on this rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelStateBytes {
    pub parameters: usize,
    pub gradients: usize,
    pub master_weights: usize,
    pub optimizer_states: usize,
}

impl ModelStateBytes {
    /// The categories by the names `memory-plan` gives them.
    pub fn by_category(&self) -> [(&'static str, usize); 4] {
        [
            ("parameters", self.parameters),
            ("gradients", self.gradients),
            ("master_weights", self.master_weights),
            ("optimizer_states", self.optimizer_states),
        ]
    }
}

fn bytes(t: &candle_core::Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}

impl Trainer {
    /// The model states this rank holds now (optimizer states exist after the first step).
    pub fn model_state_bytes(&self) -> ModelStateBytes {
        let store = self.model.store();
        let parameters = store
            .parameter_ids()
            .into_iter()
            .map(|id| bytes(store.entries()[id].tensor()))
            .sum();
        ModelStateBytes {
            parameters,
            gradients: bytes(self.grads.tensor()),
            master_weights: self.params.as_ref().map_or(0, bytes)
                + self.optimizer.own_master_bytes(),
            optimizer_states: self.optimizer.state_bytes(),
        }
    }
}
