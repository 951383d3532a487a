//! The model's buffers (BatchNorm running statistics) across ranks: a training forward writes
//! each rank's own; before anything reads them (an evaluation, a forward in a mode that reads
//! them, the whole model gathered), the strategy makes them the same on every rank
//! ([`Strategy::sync_buffers`]: rank 0's under DDP), once per run of training steps.
//!
//! [`Strategy::sync_buffers`]: crate::Strategy::sync_buffers

use super::Trainer;
use crate::error::Result;

impl Trainer {
    /// Makes the buffers the same on every rank where the strategy does (DDP: rank 0's) if a
    /// training step has written them since they last were. [`Self::evaluate`] and
    /// [`Self::gather_parameters`] call it; a loop that reads the buffers otherwise calls it
    /// first. A collective: every rank calls it.
    pub fn sync_buffers(&mut self) -> Result<()> {
        if std::mem::take(&mut self.buffers_written) {
            self.strategy.sync_buffers(&self.model)?;
        }
        Ok(())
    }

    /// The strategy's call before each micro-batch's forward: a forward that reads the buffers
    /// (BatchNorm in evaluation mode) reads synced ones; one in training mode writes them.
    pub(crate) fn strategy_before_forward(&mut self) -> Result<()> {
        let train = self.options.mode.train;
        if !train {
            self.sync_buffers()?;
        }
        self.strategy.before_forward(&self.model)?;
        self.buffers_written |= train;
        Ok(())
    }

    /// A replay of the captured step is about to run: its forward writes the buffers as the
    /// captured one did.
    #[cfg(feature = "cuda")]
    pub(crate) fn note_replayed_forward(&mut self) {
        self.buffers_written |= self.options.mode.train;
    }
}
