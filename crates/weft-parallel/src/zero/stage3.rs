//! [`ZeroStage3`]: ZeRO stage 3 (FSDP) — the parameters sharded too. Each rank keeps its shard
//! of the flat parameter buffer (the same cuts as its gradients and optimizer state) and
//! releases the model's variables ([`weft_tensor::residency`]); a block's parameters are
//! gathered from their owners just before its forward and again before its backward, the next
//! block's gather issued while the current one computes, and released once the block is done.
//!
//! Through a step:
//! - `before_forward`: every parameter released (what was written into whole parameters since
//!   the last release is kept in the shard first);
//! - `before_block_forward(b)` / `before_block_backward(b)`: all but block `b`'s parameters
//!   released, block `b`'s gathered (or its prefetched gather completed), block `b + 1`'s
//!   (`b − 1`'s in backward) gather issued;
//! - `block_ready`, `finish_backward`: stage 2's reduce of each bucket to its owners;
//! - before the update, the variables that hold this rank's shard are materialised and written,
//!   so the optimizer steps them in place as under stages 1 and 2; `after_step` reads the
//!   updated shard back and releases them.
//!
//! The gradients are stage 2's: this rank's shard only ([`super::ShardedGradients`]). A model
//! built as shards ([`weft_tensor::sharded_init`], [`super::zero_stage3_from_shard`]) is never
//! whole on any rank.

use std::ops::Range;
use std::sync::Arc;

use candle_core::Tensor;
use weft_collectives::{Communicator, ReduceOp};
use weft_tensor::{residency, BlockModel, EntryId, FlatBuffer, FlatLayout, ParamStore};

use super::block_gather::{GatherSource, PendingGather};
use super::gather::all_gather_parameters;
use super::ShardLayout;
use crate::collectives::{reduce_over_ranks, TensorCollectives};
use crate::error::{ParallelError, Result};
use crate::strategy::{ReadyGrads, Strategy};

/// ZeRO stage 3 around a gradient sync that reduces each rank's shard of the gradients to it.
pub struct ZeroStage3 {
    sync: Box<dyn Strategy>,
    comm: Arc<dyn Communicator>,
    layout: FlatLayout,
    shards: ShardLayout,
    /// This rank's shard of the parameters: the model's dtype, on its device.
    own: Tensor,
    /// The gather issued ahead of its block.
    pending: Option<PendingGather>,
}

impl ZeroStage3 {
    /// Shards `model`'s parameters over `comm`'s ranks: this rank's shard is `own` (built by
    /// a sharded initialisation), or read from the model, whole and identical on every rank
    /// (`sync` was built first and broadcast rank 0's; the variables are then released at the
    /// first step's forward).
    pub(crate) fn new(
        sync: Box<dyn Strategy>,
        (model, grads): (&BlockModel, &FlatBuffer),
        comm: Arc<dyn Communicator>,
        own: Option<Tensor>,
    ) -> Result<Self> {
        let layout = grads.layout().clone();
        let store = model.store();
        if FlatLayout::parameters(store) != layout {
            return Err(ParallelError::Config(
                "zero3: the model's parameters are not laid out as its gradients".into(),
            ));
        }
        let shards = ShardLayout::new(layout.len(), comm.world_size());
        let range = shards.range(comm.rank());
        let whole = store
            .parameter_ids()
            .iter()
            .all(|&id| residency::is_resident(store.entries()[id].tensor()));
        let own = match own {
            Some(own) if own.elem_count() == range.len() => own.to_dtype(store.dtype())?,
            Some(own) => {
                return Err(ParallelError::Config(format!(
                    "zero3: rank {}'s shard holds {} elements, its cut {range:?} of the {} parameters needs {}",
                    comm.rank(),
                    own.elem_count(),
                    layout.len(),
                    range.len()
                )))
            }
            None if whole => layout.read_range(store, range, store.dtype())?,
            None => {
                return Err(ParallelError::Config(
                    "zero3: the model was built by a sharded initialisation; pass its shard (zero_stage3_from_shard)".into(),
                ))
            }
        };
        Ok(Self {
            sync,
            comm,
            layout,
            shards,
            own,
            pending: None,
        })
    }

    /// The cuts of the flat buffers over the ranks.
    pub fn shards(&self) -> &ShardLayout {
        &self.shards
    }

    fn own_range(&self) -> Range<usize> {
        self.shards.range(self.comm.rank())
    }

    /// The store entries whose values lie (partly) in this rank's shard.
    fn own_entries(&self) -> Vec<EntryId> {
        let own = self.own_range();
        self.layout
            .slots()
            .iter()
            .filter(|slot| slot.offset < own.end && own.start < slot.offset + slot.numel())
            .map(|slot| slot.entry)
            .collect()
    }

    fn source<'a>(&'a self, store: &'a ParamStore) -> GatherSource<'a> {
        GatherSource {
            comm: self.comm.as_ref(),
            layout: &self.layout,
            shards: &self.shards,
            own: &self.own,
            store,
        }
    }

    /// Releases every parameter but `keep`.
    fn release_all_but(&self, store: &ParamStore, keep: &[EntryId]) -> Result<()> {
        for slot in self.layout.slots() {
            if !keep.contains(&slot.entry) {
                residency::release(store.entries()[slot.entry].tensor())?;
            }
        }
        Ok(())
    }

    fn all_resident(store: &ParamStore, entries: &[EntryId]) -> bool {
        entries
            .iter()
            .all(|&id| residency::is_resident(store.entries()[id].tensor()))
    }

    /// Completes the gather in flight, if any.
    fn complete_pending(&mut self, store: &ParamStore) -> Result<()> {
        match self.pending.take() {
            Some(pending) => pending.complete(&self.layout, store),
            None => Ok(()),
        }
    }

    /// Makes block `block`'s parameters whole (and only them), then issues the gather of
    /// `next`, if any.
    fn hold_block(&mut self, model: &BlockModel, block: usize, next: Option<usize>) -> Result<()> {
        let store = model.store();
        let used = model.parameters_used_by(block);
        let prefetched = self.pending.as_ref().is_some_and(|p| p.block == block);
        // Completed first: a gather's broadcasts never outlive its block's turn.
        self.complete_pending(store)?;
        self.release_all_but(store, used)?;
        if !prefetched && !Self::all_resident(store, used) {
            self.source(store)
                .start(block, used)?
                .complete(&self.layout, store)?;
        }
        if let Some(next) = next {
            let wanted = model.parameters_used_by(next);
            if !Self::all_resident(store, wanted) {
                self.pending = Some(self.source(store).start(next, wanted)?);
            }
        }
        Ok(())
    }

    /// Keeps what was written into the variables of this rank's shard while they were all
    /// whole, then releases every parameter.
    fn write_back_and_release(&mut self, store: &ParamStore) -> Result<()> {
        self.complete_pending(store)?;
        if Self::all_resident(store, &self.own_entries()) {
            self.own = self
                .layout
                .read_range(store, self.own_range(), store.dtype())?;
        }
        self.release_all_but(store, &[])
    }
}

impl Strategy for ZeroStage3 {
    fn name(&self) -> &'static str {
        "zero3"
    }

    fn wrapped(&self) -> Option<&dyn Strategy> {
        Some(self.sync.as_ref())
    }

    fn wrapped_mut(&mut self) -> Option<&mut dyn Strategy> {
        Some(self.sync.as_mut())
    }

    fn before_forward(&mut self, model: &BlockModel) -> Result<()> {
        self.sync.before_forward(model)?;
        self.write_back_and_release(model.store())
    }

    fn before_block_forward(&mut self, model: &BlockModel, block: usize) -> Result<()> {
        self.sync.before_block_forward(model, block)?;
        let next = (block + 1 < model.blocks().len()).then_some(block + 1);
        self.hold_block(model, block, next)
    }

    fn before_block_backward(&mut self, model: &BlockModel, block: usize) -> Result<()> {
        self.sync.before_block_backward(model, block)?;
        self.hold_block(model, block, block.checked_sub(1))
    }

    fn block_ready(&mut self, ready: &ReadyGrads, grads: &FlatBuffer) -> Result<()> {
        self.sync.block_ready(ready, grads)
    }

    fn finish_backward(&mut self, grads: &FlatBuffer) -> Result<()> {
        self.sync.finish_backward(grads)
    }

    /// As the gradient sync starts it (beside backward on the device), joined by its
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
        self.own_range()
    }

    /// Each rank holds the norm of its own shard: the sum over the ranks.
    fn reduce_grad_norm_squared(&mut self, local: Tensor) -> Result<Tensor> {
        self.comm.all_reduce_tensor(&local, ReduceOp::Sum)?.wait()
    }

    /// Each rank checked its own shard: the maximum over the ranks.
    fn reduce_found_inf(&mut self, local: Tensor) -> Result<Tensor> {
        reduce_over_ranks(self.comm.as_ref(), &local, ReduceOp::Max)
    }

    /// Keeps the updated shard and releases the variables that held it.
    fn after_step(&mut self, model: &BlockModel) -> Result<()> {
        let store = model.store();
        self.own = self
            .layout
            .read_range(store, self.own_range(), store.dtype())?;
        self.release_all_but(store, &[])
    }

    /// Materialises the variables that hold this rank's shard and writes it into them, so the
    /// optimizer steps them in place.
    fn before_update(&mut self, model: &BlockModel) -> Result<()> {
        let store = model.store();
        self.complete_pending(store)?;
        self.release_all_but(store, &[])?;
        for id in self.own_entries() {
            residency::materialize(store.entries()[id].tensor())?;
        }
        self.layout
            .write_range(store, self.own_range().start, &self.own)?;
        Ok(())
    }

    fn gather_parameters(&mut self, model: &BlockModel) -> Result<()> {
        let store = model.store();
        self.complete_pending(store)?;
        let all: Vec<EntryId> = self.layout.slots().iter().map(|s| s.entry).collect();
        if Self::all_resident(store, &all) {
            return Ok(());
        }
        for &id in &all {
            residency::materialize(store.entries()[id].tensor())?;
        }
        self.layout
            .write_range(store, self.own_range().start, &self.own)?;
        all_gather_parameters(self.comm.as_ref(), &self.layout, &self.shards, store)
    }

    fn release_parameters(&mut self, model: &BlockModel) -> Result<()> {
        self.write_back_and_release(model.store())
    }

    fn parameter_shard(&self) -> Option<&Tensor> {
        Some(&self.own)
    }

    /// Gathers allocate and free the variables' storage every step.
    fn capturable(&self) -> bool {
        false
    }
}
