//! Gathering the parameters one block uses from the ranks that own them (ZeRO stage 3). The
//! block's entries lie in a few runs of the flat layout (its own parameters are contiguous; a
//! tied parameter is a run of its own); each run is cut by the shards, and each part is
//! broadcast by its owner from its shard of the parameters. Every rank then materialises the
//! block's variables and writes the parts into them.
//!
//! On a GPU whose collectives the backend runs natively, each part is broadcast from the
//! owner's shard itself into one buffer on every other rank, ordered on the device (one NCCL
//! call per owner of a block, not one per variable); through the host otherwise (the CPU's
//! shared memory). When the gather completes, the block's variables are materialised and the
//! parts written into them.
//!
//! A gather is started (its broadcasts issued) before it is needed — the next block's, while
//! the current one computes — and completed when its block runs. Every rank starts and
//! completes the same gathers in the same order, so the collectives match.

use std::ops::Range;

use candle_core::Tensor;
use weft_collectives::{Communicator, DeviceJoin};
use weft_tensor::{residency, EntryId, FlatLayout, ParamStore};

use super::ShardLayout;
use crate::collectives::{
    broadcast_ordered, native_for, uninit_flat, TensorCollectives, TensorWork,
};
use crate::error::Result;

/// The runs of `layout` that `entries` cover, in layout order, adjacent slots merged.
fn runs(layout: &FlatLayout, entries: &[EntryId]) -> Vec<Range<usize>> {
    let mut ranges: Vec<Range<usize>> = entries
        .iter()
        .filter_map(|&id| layout.slot_of(id).map(|slot| slot.range()))
        .collect();
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match merged.last_mut() {
            Some(last) if last.end == range.start => last.end = range.end,
            _ => merged.push(range),
        }
    }
    merged
}

/// A block's gather in flight: its broadcasts issued, not yet written into the variables.
pub(super) struct PendingGather {
    pub block: usize,
    entries: Vec<EntryId>,
    /// Each part's flat start and its broadcast.
    parts: Vec<(usize, Transfer)>,
}

/// One part's broadcast.
enum Transfer {
    /// Through the host: the result comes back from `wait`.
    Host(Box<TensorWork>),
    /// In place in `values` (the owner's shard, or the receiver's buffer), ordered on the
    /// device.
    Device(Box<dyn DeviceJoin>, Tensor),
}

/// What a gather reads: the cuts, this rank's shard of the parameters (1-D, the store's dtype,
/// on its device, over `shards.range(rank)`) and the model's store.
pub(super) struct GatherSource<'a> {
    pub comm: &'a dyn Communicator,
    pub layout: &'a FlatLayout,
    pub shards: &'a ShardLayout,
    pub own: &'a Tensor,
    pub store: &'a ParamStore,
}

impl GatherSource<'_> {
    /// Issues the broadcasts that bring every rank the values of `entries` (block `block`'s):
    /// one per owner of each run, from the owner's shard itself into a buffer on the others.
    pub fn start(&self, block: usize, entries: &[EntryId]) -> Result<PendingGather> {
        let rank = self.comm.rank();
        let (device, dtype) = (self.store.device(), self.store.dtype());
        let native = native_for(self.comm, device);
        let mut parts = Vec::new();
        for run in runs(self.layout, entries) {
            for (owner, part) in self.shards.owners(run) {
                let values = match owner == rank {
                    true => self.own_part(&part)?,
                    false => uninit_flat(device, part.len(), dtype)?,
                };
                let transfer = match native {
                    Some(native) => {
                        Transfer::Device(broadcast_ordered(native, &values, owner)?, values)
                    }
                    None => Transfer::Host(Box::new(self.comm.broadcast_tensor(&values, owner)?)),
                };
                parts.push((part.start, transfer));
            }
        }
        Ok(PendingGather {
            block,
            entries: entries.to_vec(),
            parts,
        })
    }

    /// This rank's values over `part` of the layout (which its shard holds).
    fn own_part(&self, part: &Range<usize>) -> Result<Tensor> {
        let own_start = self.shards.range(self.comm.rank()).start;
        Ok(self.own.narrow(0, part.start - own_start, part.len())?)
    }
}

impl PendingGather {
    /// Waits for the broadcasts (on the device: joins them, the compute stream then waiting
    /// for them) and writes the values into the block's materialised variables.
    pub fn complete(self, layout: &FlatLayout, store: &ParamStore) -> Result<()> {
        for &id in &self.entries {
            residency::materialize(store.entries()[id].tensor())?;
        }
        for (start, transfer) in self.parts {
            let values = match transfer {
                Transfer::Host(work) => work.wait()?,
                Transfer::Device(join, values) => {
                    join.join()?;
                    values
                }
            };
            layout.write_range(store, start, &values)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};
    use weft_tensor::EntryKind;

    use super::*;

    #[test]
    fn a_blocks_entries_form_merged_runs() {
        let mut store = ParamStore::new(&Device::Cpu, DType::F32);
        for (name, n) in [("a", 3), ("b", 2), ("c", 4), ("d", 1)] {
            let value = Tensor::zeros(n, DType::F32, &Device::Cpu).unwrap();
            store.register(name, EntryKind::Parameter, value).unwrap();
        }
        let layout = FlatLayout::parameters(&store);
        assert_eq!(runs(&layout, &[1, 0, 3]), vec![0..5, 9..10]);
        assert_eq!(runs(&layout, &[2]), vec![5..9]);
        assert_eq!(runs(&layout, &[]), Vec::<Range<usize>>::new());
    }
}
