//! The reference data parallelism: after backward, all-reduce (average) every parameter's
//! gradient, one blocking call per parameter. Slow and simple: the oracle that the bucketed,
//! overlapped [`super::DistributedDataParallel`] is tested against.

use std::sync::Arc;

use weft_collectives::{Communicator, ReduceOp, TensorCollectives};
use weft_tensor::{EntryId, FlatBuffer, ParamStore};

use super::{broadcast_entries, check_same_model, GradientSync};
use crate::error::Result;

/// All-reduce every gradient after backward.
pub struct NaiveDataParallel {
    comm: Arc<dyn Communicator>,
    require_sync: bool,
}

impl NaiveDataParallel {
    /// Checks that every rank has the same model, then broadcasts rank 0's parameters and
    /// buffers so every replica starts identical.
    pub fn new(store: &ParamStore, comm: Arc<dyn Communicator>) -> Result<Self> {
        check_same_model(store, comm.as_ref())?;
        let all: Vec<EntryId> = (0..store.len()).collect();
        broadcast_entries(store, &all, comm.as_ref(), 0)?;
        Ok(Self {
            comm,
            require_sync: true,
        })
    }
}

impl GradientSync for NaiveDataParallel {
    fn before_forward(&mut self, _store: &ParamStore) -> Result<()> {
        Ok(())
    }

    fn block_ready(&mut self, _params: &[EntryId], _grads: &FlatBuffer) -> Result<()> {
        Ok(())
    }

    fn finish(&mut self, grads: &FlatBuffer) -> Result<()> {
        if !self.require_sync {
            return Ok(());
        }
        for slot in grads.layout().slots() {
            let view = grads.view(slot)?;
            let averaged = self.comm.all_reduce_tensor(&view, ReduceOp::Avg)?.wait()?;
            grads.write(slot, &averaged)?;
        }
        Ok(())
    }

    fn set_require_sync(&mut self, sync: bool) {
        self.require_sync = sync;
    }
}
