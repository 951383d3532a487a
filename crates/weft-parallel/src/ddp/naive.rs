//! The reference data parallelism: after backward, all-reduce (average) every parameter's
//! gradient, one blocking call per parameter. Slow and simple: the oracle that the bucketed,
//! overlapped [`super::DistributedDataParallel`] is tested against.

use std::sync::Arc;

use candle_core::Tensor;
use weft_collectives::{Communicator, ReduceOp};
use weft_tensor::{BlockModel, EntryId, FlatBuffer};

use super::{broadcast_entries, check_same_model};
use crate::collectives::{reduce_over_ranks, TensorCollectives};
use crate::error::Result;
use crate::ready::ReadyCheck;
use crate::strategy::{ReadyGrads, Strategy};

/// All-reduce every gradient after backward.
pub struct NaiveDataParallel {
    comm: Arc<dyn Communicator>,
    check: ReadyCheck,
    require_sync: bool,
}

impl NaiveDataParallel {
    /// Checks that every rank has the same model, then broadcasts rank 0's parameters and
    /// buffers so every replica starts identical. Unused parameters are reduced as zero when
    /// `find_unused_parameters`, an error otherwise.
    pub fn new(
        model: &BlockModel,
        comm: Arc<dyn Communicator>,
        find_unused_parameters: bool,
    ) -> Result<Self> {
        let store = model.store();
        check_same_model(store, comm.as_ref())?;
        let all: Vec<EntryId> = (0..store.len()).collect();
        broadcast_entries(store, &all, comm.as_ref(), 0)?;
        Ok(Self {
            comm,
            check: ReadyCheck::new(store, find_unused_parameters),
            require_sync: true,
        })
    }
}

impl Strategy for NaiveDataParallel {
    fn name(&self) -> &'static str {
        "naive-ddp"
    }

    fn block_ready(&mut self, ready: &ReadyGrads, _grads: &FlatBuffer) -> Result<()> {
        self.check.report(ready)?;
        Ok(())
    }

    fn finish_backward(&mut self, grads: &FlatBuffer) -> Result<()> {
        self.check.finish()?;
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

    /// The flag's maximum over the ranks (an all-reduce the host waits for).
    fn reduce_found_inf(&mut self, local: Tensor) -> Result<Tensor> {
        reduce_over_ranks(self.comm.as_ref(), &local, ReduceOp::Max)
    }

    /// Every rank is a replica that saw other samples.
    fn sum_over_replicas(
        &mut self,
        local: &mut dyn FnMut() -> Result<Tensor>,
    ) -> Result<Option<Tensor>> {
        crate::collectives::sum_over_replicas(self.comm.as_ref(), local)
    }

    fn set_require_sync(&mut self, sync: bool) {
        self.check.reset();
        self.require_sync = sync;
    }
}
