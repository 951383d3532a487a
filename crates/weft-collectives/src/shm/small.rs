//! Latency path for small all-reduces and reduces: each rank copies its whole buffer into
//! its slot, one round of flags, then every rank that needs the result reduces all slots
//! itself, in rank order (so every rank gets bit-identical results).

use crate::error::Result;
use crate::reduce_op::reduce_into;
use crate::shm::descriptor::OpDesc;
use crate::shm::engine::{copy_bytes, ShmEngine};

impl ShmEngine {
    /// Reduces `data` (one whole message, at most one slot long) across ranks. With
    /// `root: None` every rank gets the result; with `Some(root)` only `root` does.
    pub(crate) fn small_reduce(
        &mut self,
        data: &mut [u8],
        desc: &OpDesc,
        root: Option<usize>,
    ) -> Result<()> {
        let op = desc.name();
        let reduce = desc.reduce.expect("reductions carry a reduce op");
        debug_assert!(data.len() <= self.region.layout().slot_bytes);
        let slot = self.claim_slot(op)?;
        self.publish(slot, desc);
        // SAFETY: the claimed slot is ours and no rank reads it until we arrive.
        unsafe { copy_bytes(data.as_ptr(), self.region.slot(self.rank, slot), data.len()) };
        self.arrive();
        self.wait_all(op)?;
        self.check_peers_match(slot, desc)?;
        if root.is_none_or(|root| root == self.rank) {
            let sources: Vec<*const u8> = (0..self.world_size)
                .map(|rank| self.region.slot(rank, slot) as *const u8)
                .collect();
            // SAFETY: every rank has filled its slot with `count` elements and none writes it
            // again before we arrive; `data` is a separate buffer of the same length.
            unsafe { reduce_into(desc.dtype, reduce, &sources, data.as_mut_ptr(), desc.count) };
        }
        self.arrive();
        self.release_slot(slot);
        Ok(())
    }
}
