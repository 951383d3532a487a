//! A hook through which layers that need statistics of the *global* batch (SyncBatchNorm)
//! reach the other ranks, without models depending on any communication library.
//!
//! A model hands one [`CrossRankSlot`] to each such layer; a parallel strategy fills it with
//! a [`CrossRankSum`] (e.g. weft-parallel's all-reduce), PyTorch's `convert_sync_batchnorm`.
//! While the slot is empty the layers use their local batch only.

use std::sync::{Arc, RwLock};

use candle_core::Tensor;

/// A differentiable sum over ranks: forward all-reduces the values; backward all-reduces the
/// incoming gradient (the conjugate of the forward).
pub trait CrossRankSum: Send + Sync {
    fn sum(&self, values: &Tensor) -> candle_core::Result<Tensor>;
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
