//! Broadcast (the root streams chunks through its two slots, the others copy them out as
//! soon as the root has written them) and barrier (one round of flags).

use crate::error::Result;
use crate::shm::descriptor::OpDesc;
use crate::shm::engine::{copy_bytes, ShmEngine};

impl ShmEngine {
    /// Broadcasts `data` from `desc.root` to every rank.
    pub(crate) fn pipelined_broadcast(&mut self, data: &mut [u8], desc: &OpDesc) -> Result<()> {
        let op = desc.name();
        let root = desc.root.expect("broadcasts carry a root");
        let chunk = self.region.layout().slot_bytes;
        let rounds = data.len().div_ceil(chunk).max(1);
        for round in 0..rounds {
            let start = round * chunk;
            let len = chunk.min(data.len() - start);
            let slot = self.claim_slot(op)?;
            if round == 0 {
                self.publish(slot, desc);
            }
            if self.rank == root {
                // SAFETY: the claimed slot is ours and at least `chunk` bytes long.
                unsafe { copy_bytes(data.as_ptr().add(start), self.region.slot(root, slot), len) };
            }
            self.arrive();
            if round == 0 {
                self.wait_all(op)?;
                self.check_peers_match(slot, desc)?;
            } else if self.rank != root {
                self.wait_rank(op, root)?;
            }
            if self.rank != root {
                // SAFETY: the root filled this slot and keeps it until every rank arrives again.
                unsafe {
                    copy_bytes(
                        self.region.slot(root, slot),
                        data.as_mut_ptr().add(start),
                        len,
                    )
                };
            }
            self.arrive();
            self.release_slot(slot);
        }
        Ok(())
    }

    /// Returns once every rank has arrived.
    pub(crate) fn flag_barrier(&mut self, desc: &OpDesc) -> Result<()> {
        let op = desc.name();
        let slot = self.claim_slot(op)?;
        self.publish(slot, desc);
        self.arrive();
        self.wait_all(op)?;
        self.check_peers_match(slot, desc)?;
        self.arrive();
        self.release_slot(slot);
        Ok(())
    }
}
