//! Bookkeeping of which parameters' gradients a backward pass has reported: each exactly
//! once per backward, unused ones only when allowed, none missing at the end.

use weft_tensor::{EntryId, ParamStore};

use crate::error::{ParallelError, Result};
use crate::strategy::ReadyGrads;

/// Checks one backward's reports against the model's parameters.
pub(crate) struct ReadyCheck {
    names: Vec<String>,
    expected: Vec<bool>,
    reported: Vec<bool>,
    find_unused_parameters: bool,
}

impl ReadyCheck {
    pub(crate) fn new(store: &ParamStore, find_unused_parameters: bool) -> Self {
        let mut expected = vec![false; store.len()];
        for id in store.parameter_ids() {
            expected[id] = true;
        }
        Self {
            names: store.entries().iter().map(|e| e.name.clone()).collect(),
            expected,
            reported: vec![false; store.len()],
            find_unused_parameters,
        }
    }

    /// Marks `ready`'s parameters reported; returns every parameter now ready, used or
    /// accepted as unused. Fails on one reported twice, on one that is not a parameter, and on
    /// an unused one unless unused parameters are accepted.
    pub(crate) fn report(&mut self, ready: &ReadyGrads) -> Result<Vec<EntryId>> {
        if let (Some(&id), false) = (ready.unused.first(), self.find_unused_parameters) {
            return Err(ParallelError::UnusedParameter {
                name: self.names[id].clone(),
            });
        }
        let all: Vec<EntryId> = ready.params.iter().chain(&ready.unused).copied().collect();
        for &id in &all {
            if !self.expected.get(id).copied().unwrap_or(false) {
                return Err(ParallelError::Config(format!(
                    "block {} reported a gradient for entry {id}, which is not a parameter",
                    ready.block
                )));
            }
            if std::mem::replace(&mut self.reported[id], true) {
                return Err(ParallelError::ReadyTwice {
                    name: self.names[id].clone(),
                });
            }
        }
        Ok(all)
    }

    /// Ends a backward: fails naming the parameters never reported, and starts over.
    pub(crate) fn finish(&mut self) -> Result<()> {
        let missing: Vec<String> = (0..self.names.len())
            .filter(|&id| self.expected[id] && !self.reported[id])
            .map(|id| self.names[id].clone())
            .collect();
        self.reported.fill(false);
        if missing.is_empty() {
            Ok(())
        } else {
            Err(ParallelError::GradientsNotReady { names: missing })
        }
    }

    /// Forgets this backward's reports (a backward that does not communicate).
    pub(crate) fn reset(&mut self) {
        self.reported.fill(false);
    }
}
