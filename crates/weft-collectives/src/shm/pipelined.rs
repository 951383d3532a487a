//! Bandwidth path: reduce-scatter then all-gather, chunked through each rank's two slots so
//! that round `i + 1` fills one slot while peers still read round `i` from the other.
//!
//! In shared memory every slot is one hop from every rank, so the reduce-scatter step does
//! not relay partial sums around a ring: each rank reduces its share of the chunk from all
//! sources at once, in rank order with one rounding (bit-identical on all ranks), and the
//! others copy that share out. In the all-reduce each rank copies only its peers' shares into
//! its slot, reads its own share straight from its buffer and writes the result back there:
//! per round it copies `(n - 1)/n` of the chunk in and as much out. Copying the whole chunk in
//! and every share out instead measured 5.8 against 7.4 GB/s at 64 MiB on 2 ranks of a 2-core
//! machine (docs/history/2026-11.md, 2026-11-25).

use crate::buffer::Buffer;
use crate::error::Result;
use crate::reduce_op::reduce_into;
use crate::shm::descriptor::OpDesc;
use crate::shm::engine::{copy_bytes, share, ShmEngine};

impl ShmEngine {
    fn slot_elems(&self, desc: &OpDesc) -> usize {
        self.region.layout().slot_bytes / desc.dtype.size_in_bytes()
    }

    /// Pipelined all-reduce (`root: None`) or reduce to `root` of `data`.
    pub(crate) fn pipelined_reduce(
        &mut self,
        data: &mut [u8],
        desc: &OpDesc,
        root: Option<usize>,
    ) -> Result<()> {
        let (op, elem, n) = (desc.name(), desc.dtype.size_in_bytes(), self.world_size);
        let reduce = desc.reduce.expect("reductions carry a reduce op");
        let chunk = self.slot_elems(desc);
        let rounds = desc.count.div_ceil(chunk).max(1);
        let receives = root.is_none_or(|root| root == self.rank);
        // Whether peers read this rank's reduced share: all of them in an all-reduce, the root
        // in a reduce to another rank.
        let shares_result = root != Some(self.rank);
        for round in 0..rounds {
            let start = round * chunk;
            let count = chunk.min(desc.count - start);
            let slot = self.claim_slot(op)?;
            if round == 0 {
                self.publish(slot, desc);
            }
            let mine = self.region.slot(self.rank, slot);
            let chunk_at = data.as_mut_ptr().wrapping_add(start * elem);
            // The peers' shares of this chunk go to the slot; this rank's own stays in `data`.
            for rank in (0..n).filter(|&r| r != self.rank) {
                let part = share(count, n, rank);
                // SAFETY: the claimed slot is ours; `data` holds `desc.count` elements.
                unsafe {
                    let at = part.start * elem;
                    copy_bytes(chunk_at.add(at), mine.add(at), part.len() * elem);
                }
            }
            self.arrive();
            self.wait_all(op)?;
            if round == 0 {
                self.check_peers_match(slot, desc)?;
            }
            let part = share(count, n, self.rank);
            let (at, bytes) = (part.start * elem, part.len() * elem);
            let sources: Vec<*const u8> = (0..n)
                .map(|rank| {
                    if rank == self.rank {
                        chunk_at.wrapping_add(at) as *const u8
                    } else {
                        self.region.slot(rank, slot).wrapping_add(at) as *const u8
                    }
                })
                .collect();
            // The result goes over this rank's own source in `data` where it receives (then to
            // the slot for the peers that read it), else to the slot only.
            // SAFETY: each peer's slot holds this share of the round until it arrives again,
            // and only this rank writes this share of its slot and of `data`.
            unsafe {
                if receives {
                    reduce_into(desc.dtype, reduce, &sources, chunk_at.add(at), part.len());
                    if shares_result {
                        copy_bytes(chunk_at.add(at), mine.add(at), bytes);
                    }
                } else {
                    reduce_into(desc.dtype, reduce, &sources, mine.add(at), part.len());
                }
            }
            self.arrive();
            if receives {
                self.wait_all(op)?;
                for rank in (0..n).filter(|&r| r != self.rank) {
                    let part = share(count, n, rank);
                    let at = part.start * elem;
                    // SAFETY: rank `rank` finished reducing its share into its slot and will
                    // not write it again until we arrive past this round.
                    unsafe {
                        let src = self.region.slot(rank, slot).add(at);
                        copy_bytes(src, chunk_at.add(at), part.len() * elem);
                    }
                }
            }
            self.arrive();
            self.release_slot(slot);
        }
        Ok(())
    }

    /// Reduce-scatter: `buffer` holds `world_size` shards; it ends up holding this rank's
    /// reduced shard.
    pub(crate) fn pipelined_reduce_scatter(
        &mut self,
        buffer: &mut Buffer,
        desc: &OpDesc,
    ) -> Result<()> {
        let (op, elem, n) = (desc.name(), desc.dtype.size_in_bytes(), self.world_size);
        let reduce = desc.reduce.expect("reductions carry a reduce op");
        let shard = desc.count / n;
        let per_shard = (self.slot_elems(desc) / n).max(1);
        let rounds = shard.div_ceil(per_shard).max(1);
        let data = buffer.as_bytes_mut();
        for round in 0..rounds {
            let start = round * per_shard;
            let count = per_shard.min(shard - start);
            let slot = self.claim_slot(op)?;
            if round == 0 {
                self.publish(slot, desc);
            }
            let mine = self.region.slot(self.rank, slot);
            for dest in 0..n {
                // SAFETY: the claimed slot is ours and holds n * count elements.
                unsafe {
                    let src = data.as_ptr().add((dest * shard + start) * elem);
                    copy_bytes(src, mine.add(dest * count * elem), count * elem);
                }
            }
            self.arrive();
            self.wait_all(op)?;
            if round == 0 {
                self.check_peers_match(slot, desc)?;
            }
            let sources: Vec<*const u8> = (0..n)
                // SAFETY: each slot holds n pieces of `count` elements.
                .map(
                    |rank| unsafe { self.region.slot(rank, slot).add(self.rank * count * elem) }
                        as *const u8,
                )
                .collect();
            // The result goes over input elements this round has already copied out.
            // SAFETY: `data` is not in the segment and holds at least start + count elements.
            unsafe {
                reduce_into(
                    desc.dtype,
                    reduce,
                    &sources,
                    data.as_mut_ptr().add(start * elem),
                    count,
                )
            };
            self.arrive();
            self.release_slot(slot);
        }
        buffer.truncate(shard);
        Ok(())
    }

    /// All-gather: `buffer` holds this rank's input; it ends up holding every rank's, in
    /// rank order.
    pub(crate) fn pipelined_all_gather(
        &mut self,
        buffer: &mut Buffer,
        desc: &OpDesc,
    ) -> Result<()> {
        let (op, elem, n) = (desc.name(), desc.dtype.size_in_bytes(), self.world_size);
        let chunk = self.slot_elems(desc);
        let rounds = desc.count.div_ceil(chunk).max(1);
        buffer.resize_zeroed(desc.count * n);
        let data = buffer.as_bytes_mut();
        for round in 0..rounds {
            let start = round * chunk;
            let count = chunk.min(desc.count - start);
            let slot = self.claim_slot(op)?;
            if round == 0 {
                self.publish(slot, desc);
            }
            // SAFETY: the claimed slot is ours; the input occupies the first count elements.
            unsafe {
                copy_bytes(
                    data.as_ptr().add(start * elem),
                    self.region.slot(self.rank, slot),
                    count * elem,
                )
            };
            self.arrive();
            self.wait_all(op)?;
            if round == 0 {
                self.check_peers_match(slot, desc)?;
            }
            for rank in 0..n {
                // Rank 0's piece lands on input elements this round has already copied out.
                // SAFETY: every slot holds this round's `count` elements until we arrive.
                unsafe {
                    let dst = data.as_mut_ptr().add((rank * desc.count + start) * elem);
                    copy_bytes(self.region.slot(rank, slot), dst, count * elem);
                }
            }
            self.arrive();
            self.release_slot(slot);
        }
        Ok(())
    }
}
