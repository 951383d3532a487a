//! [`ZeroRedundancy`]: the optimizer sharded over the data-parallel ranks, around a gradient
//! synchronisation that brings each rank the averaged gradients of its shard. The step calls
//! it like any strategy: backward hooks go to the gradient sync; the optimizer steps only this
//! rank's shard ([`Strategy::optimizer_range`], so its states — momentum, Adam's moments, the
//! master weights of a 16-bit model on a GPU — exist for that shard only); the squared
//! gradient norm and the loss scaler's inf flag are reduced over the shards; and
//! [`Strategy::after_step`] all-gathers the updated parameters.

use std::ops::Range;
use std::sync::Arc;

use candle_core::Tensor;
use weft_collectives::{Communicator, ReduceOp};
use weft_tensor::{BlockModel, FlatBuffer, FlatLayout};

use super::gather::all_gather_parameters;
use super::ShardLayout;
use crate::collectives::{reduce_over_ranks, TensorCollectives};
use crate::error::{ParallelError, Result};
use crate::strategy::{ReadyGrads, Strategy};

/// A sharded optimizer over a data-parallel gradient sync.
pub struct ZeroRedundancy {
    name: &'static str,
    sync: Box<dyn Strategy>,
    comm: Arc<dyn Communicator>,
    layout: FlatLayout,
    shards: ShardLayout,
}

impl ZeroRedundancy {
    /// Shards the optimizer of `model` (whose gradients are laid out as `grads`) over `comm`'s
    /// ranks, with `sync` bringing each rank its shard's averaged gradients.
    pub(crate) fn new(
        name: &'static str,
        sync: Box<dyn Strategy>,
        grads: &FlatBuffer,
        comm: Arc<dyn Communicator>,
    ) -> Self {
        let layout = grads.layout().clone();
        let shards = ShardLayout::new(layout.len(), comm.world_size());
        Self {
            name,
            sync,
            comm,
            layout,
            shards,
        }
    }

    /// The cuts of the flat buffers over the ranks.
    pub fn shards(&self) -> &ShardLayout {
        &self.shards
    }
}

impl Strategy for ZeroRedundancy {
    fn name(&self) -> &'static str {
        self.name
    }

    fn wrapped(&self) -> Option<&dyn Strategy> {
        Some(self.sync.as_ref())
    }

    fn wrapped_mut(&mut self) -> Option<&mut dyn Strategy> {
        Some(self.sync.as_mut())
    }

    fn block_ready(&mut self, ready: &ReadyGrads, grads: &FlatBuffer) -> Result<()> {
        self.sync.block_ready(ready, grads)
    }

    fn finish_backward(&mut self, grads: &FlatBuffer) -> Result<()> {
        self.sync.finish_backward(grads)
    }

    /// As the gradient sync holds (DDP under ZeRO-1: its last bucket; this rank's optimizer
    /// steps that bucket's part of its shard last).
    fn finish_backward_holding_last(&mut self, grads: &FlatBuffer) -> Result<Option<Range<usize>>> {
        self.sync.finish_backward_holding_last(grads)
    }

    fn finish_held_gradients(&mut self, grads: &FlatBuffer) -> Result<()> {
        self.sync.finish_held_gradients(grads)
    }

    /// As the gradient sync starts it (DDP under ZeRO-1: beside backward), joined by its
    /// `finish_backward`.
    fn start_sum_over_replicas(
        &mut self,
        local: &mut dyn FnMut() -> Result<Tensor>,
    ) -> Result<Option<Tensor>> {
        self.sync.start_sum_over_replicas(local)
    }

    fn set_require_sync(&mut self, sync: bool) {
        self.sync.set_require_sync(sync)
    }

    fn optimizer_range(&self, len: usize) -> Range<usize> {
        debug_assert_eq!(len, self.shards.len(), "the flat buffers the shards cut");
        self.shards.range(self.comm.rank())
    }

    /// Each rank holds the norm of its own shard: the sum over the ranks.
    fn reduce_grad_norm_squared(&mut self, local: Tensor) -> Result<Tensor> {
        self.comm.all_reduce_tensor(&local, ReduceOp::Sum)?.wait()
    }

    /// Each rank checked its own shard: the maximum over the ranks.
    fn reduce_found_inf(&mut self, local: Tensor) -> Result<Tensor> {
        reduce_over_ranks(self.comm.as_ref(), &local, ReduceOp::Max)
    }

    fn after_step(&mut self, model: &BlockModel) -> Result<()> {
        let store = model.store();
        if FlatLayout::parameters(store) != self.layout {
            return Err(ParallelError::Config(format!(
                "{}: the model's parameters are not laid out as the gradients it was built for",
                self.name
            )));
        }
        all_gather_parameters(self.comm.as_ref(), &self.layout, &self.shards, store)
    }

    /// The norm, the inf flag and the all-gather wait on the host.
    fn capturable(&self) -> bool {
        false
    }
}
