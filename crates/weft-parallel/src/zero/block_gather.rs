//! Gathering the parameters one block uses from the ranks that own them (ZeRO stage 3). The
//! block's entries lie in a few runs of the flat layout (its own parameters are contiguous; a
//! tied parameter is a run of its own); each run is cut by the shards, and each part is
//! broadcast by its owner from its shard of the parameters. Every rank then materialises the
//! block's variables and writes the parts into them.
//!
//! On a GPU whose collectives the backend runs natively, the variables are materialised when
//! the gather starts, the owner writes its part into them, and each part of each variable is
//! broadcast in place, ordered on the device: no buffer beyond the variables themselves.
//! Through the host otherwise (the CPU's shared memory), each part broadcast into a fresh tensor
//! and written into the variables when the gather completes.
//!
//! A gather is started (its broadcasts issued) before it is needed — the next block's, while
//! the current one computes — and completed when its block runs. Every rank starts and
//! completes the same gathers in the same order, so the collectives match.

use std::ops::Range;

use candle_core::Tensor;
use weft_collectives::{Communicator, DeviceCollectives, DeviceJoin};
use weft_tensor::{residency, EntryId, FlatLayout, ParamStore};

use super::ShardLayout;
use crate::collectives::{broadcast_ordered, native_for, TensorCollectives, TensorWork};
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

/// A block's gather in flight: its broadcasts issued.
pub(super) struct PendingGather {
    pub block: usize,
    entries: Vec<EntryId>,
    parts: GatherParts,
}

/// The broadcasts of a gather.
enum GatherParts {
    /// Through the host: each part's flat start and its broadcast, written into the variables
    /// when complete.
    Host(Vec<(usize, TensorWork)>),
    /// In place in the materialised variables, ordered on the device.
    Device(Vec<Box<dyn DeviceJoin>>),
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
    /// Issues the broadcasts that bring every rank the values of `entries` (block `block`'s).
    pub fn start(&self, block: usize, entries: &[EntryId]) -> Result<PendingGather> {
        let parts = match native_for(self.comm, self.store.device()) {
            Some(device) => GatherParts::Device(self.start_in_place(device, entries)?),
            None => GatherParts::Host(self.start_through_host(entries)?),
        };
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

    fn start_through_host(&self, entries: &[EntryId]) -> Result<Vec<(usize, TensorWork)>> {
        let mut parts = Vec::new();
        for run in runs(self.layout, entries) {
            for (owner, part) in self.shards.owners(run) {
                let values = match owner == self.comm.rank() {
                    true => self.own_part(&part)?,
                    false => Tensor::zeros(part.len(), self.store.dtype(), self.store.device())?,
                };
                parts.push((part.start, self.comm.broadcast_tensor(&values, owner)?));
            }
        }
        Ok(parts)
    }

    /// Materialises the variables of `entries`, writes this rank's parts into them and
    /// broadcasts every owner's part of every variable in place.
    fn start_in_place(
        &self,
        device: &dyn DeviceCollectives,
        entries: &[EntryId],
    ) -> Result<Vec<Box<dyn DeviceJoin>>> {
        let mut joins = Vec::new();
        for &id in entries {
            let Some(slot) = self.layout.slot_of(id) else {
                continue;
            };
            let variable = self.store.entries()[id].tensor();
            residency::materialize(variable)?;
            let flat = variable.flatten_all()?;
            for (owner, part) in self.shards.owners(slot.range()) {
                let view = flat.narrow(0, part.start - slot.offset, part.len())?;
                if owner == self.comm.rank() {
                    view.slice_set(&self.own_part(&part)?, 0, 0)?;
                }
                joins.push(broadcast_ordered(device, &view, owner)?);
            }
        }
        Ok(joins)
    }
}

impl PendingGather {
    /// Waits for the broadcasts (joins them, on the device) and, through the host, writes the
    /// values into the block's materialised variables.
    pub fn complete(self, layout: &FlatLayout, store: &ParamStore) -> Result<()> {
        match self.parts {
            GatherParts::Device(joins) => {
                for join in joins {
                    join.join()?;
                }
            }
            GatherParts::Host(parts) => {
                for &id in &self.entries {
                    residency::materialize(store.entries()[id].tensor())?;
                }
                for (start, work) in parts {
                    layout.write_range(store, start, &work.wait()?)?;
                }
            }
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
