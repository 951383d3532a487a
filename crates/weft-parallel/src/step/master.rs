//! The optimizer a trainer steps and the flat master copy of the parameters it keeps for it
//! (mixed precision, offload): made at the first step, reloaded from the model, or loaded from a
//! checkpoint.

use candle_core::Tensor;
use weft_optim::ModelOptimizer;

use super::Trainer;
use crate::error::{ParallelError, Result};

impl Trainer {
    /// The optimizer (after a delayed update in flight has finished).
    pub fn optimizer(&mut self) -> Result<&ModelOptimizer> {
        Ok(self.settled_optimizer()?)
    }

    /// The optimizer, to load a checkpoint's state into (after a delayed update in flight has
    /// finished).
    pub fn optimizer_mut(&mut self) -> Result<&mut ModelOptimizer> {
        self.settled_optimizer()
    }

    /// Reads the master copy again from the model's parameters, over the range the strategy
    /// gives this rank's optimizer (after the model was loaded or made identical to rank 0's).
    /// A host optimizer steps its master copy in host memory, wherever the model is: on a GPU
    /// that is ZeRO-Offload's arrangement.
    /// Under ZeRO-3 the strategy's shard of the parameters is that range.
    pub fn reload_master_weights(&mut self) -> Result<()> {
        self.settle()?;
        if let Some(dtype) = self.master_dtype {
            let layout = self.grads.layout();
            let range = self.strategy.optimizer_range(layout.len());
            let values = match self.strategy.parameter_shard() {
                Some(shard) => shard.to_dtype(dtype)?,
                None => layout.read_range(self.model.store(), range, dtype)?,
            };
            self.params = Some(values.to_device(&candle_core::Device::Cpu)?);
        }
        Ok(())
    }

    /// Replaces the master copy (over the optimizer's range) with `values`, e.g. a
    /// checkpoint's: more precise than the 16-bit parameters it was rounded into.
    pub fn load_master_weights(&mut self, values: &Tensor) -> Result<()> {
        self.settle()?;
        if self.params.is_none() {
            self.reload_master_weights()?;
        }
        let Some(master) = &self.params else {
            return Err(ParallelError::Config(
                "this optimizer keeps no master copy to load".into(),
            ));
        };
        if values.elem_count() != master.elem_count() {
            return Err(ParallelError::Config(format!(
                "master weights of {} elements, the optimizer's range holds {}",
                values.elem_count(),
                master.elem_count()
            )));
        }
        let values = values.flatten_all()?.to_dtype(master.dtype())?;
        self.params = Some(values.to_device(master.device())?.copy()?);
        Ok(())
    }

    /// Whether the optimizer steps a master copy of its own (mixed precision, offload), made at
    /// the first step or when loaded.
    pub fn keeps_master_copy(&self) -> bool {
        self.master_dtype.is_some()
    }

    /// The flat master copy of the parameters the optimizer steps (over its range of the flat
    /// buffers), where it keeps one (from the first step on, or once a strategy is set), after
    /// a delayed update in flight has finished. Under the delayed update it may be one update
    /// ahead of the parameters.
    pub fn master_weights(&mut self) -> Result<Option<&Tensor>> {
        self.settle()?;
        Ok(self.params.as_ref())
    }
}
