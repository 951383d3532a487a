//! A hook through which layers that need statistics of the *global* batch (SyncBatchNorm)
//! reach the other ranks, without models depending on any communication library.
//!
//! A model hands one [`CrossRankSlot`] to each such layer; a parallel strategy fills it with
//! a [`CrossRankSum`] (e.g. weft-parallel's all-reduce), PyTorch's `convert_sync_batchnorm`.
//! While the slot is empty the layers use their local batch only.

use std::sync::{Arc, RwLock};

use candle_core::Tensor;

/// Sums and gathers over ranks.
pub trait CrossRankSum: Send + Sync {
    /// The sum over the ranks, differentiable: its backward sums the incoming gradient over
    /// the ranks (the conjugate of the forward).
    fn sum(&self, values: &Tensor) -> candle_core::Result<Tensor>;

    /// The sum over the ranks of `values`, which the caller gives up (contiguous, read by
    /// nothing else): reduced in place where the device allows, no copy; not differentiable.
    fn sum_owned(&self, values: Tensor) -> candle_core::Result<Tensor>;

    /// Every rank's `values` (of one shape on every rank) stacked in rank order, shape
    /// `[ranks, ..]`; not differentiable.
    fn gather(&self, values: &Tensor) -> candle_core::Result<Tensor>;
}

/// A shared, initially empty place for a [`CrossRankSum`].
#[derive(Clone, Default)]
pub struct CrossRankSlot(Arc<RwLock<Option<Arc<dyn CrossRankSum>>>>);

impl CrossRankSlot {
    /// Installs `sum` for every layer sharing this slot.
    pub fn set(&self, sum: Arc<dyn CrossRankSum>) {
        *self.0.write().expect("cross-rank slot lock") = Some(sum);
    }

    /// The installed sum, if any.
    pub fn get(&self) -> Option<Arc<dyn CrossRankSum>> {
        self.0.read().expect("cross-rank slot lock").clone()
    }
}

impl std::fmt::Debug for CrossRankSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CrossRankSlot({})",
            if self.get().is_some() { "set" } else { "empty" }
        )
    }
}
