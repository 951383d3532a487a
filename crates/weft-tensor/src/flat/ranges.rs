//! Ranges of the flat layout read from and written to the model's variables directly, without
//! a whole flat buffer: the unit of ZeRO, where a rank owns the elements of one range (its
//! shard), cutting through entries at either end. [`FlatLayout::read_range`] gathers the
//! current values of a range into one 1-D tensor; [`FlatLayout::write_range`] writes such a
//! tensor back into the variables, in place.

use std::ops::Range;

use candle_core::{DType, Tensor};

use super::FlatLayout;
use crate::error::{Result, TensorError};
use crate::params::ParamStore;

/// One entry's part of a range: the slot index, and the elements within the entry.
fn pieces(layout: &FlatLayout, range: &Range<usize>) -> Vec<(usize, Range<usize>)> {
    layout
        .slots()
        .iter()
        .enumerate()
        .filter_map(|(i, slot)| {
            let start = slot.offset.max(range.start);
            let end = (slot.offset + slot.numel()).min(range.end);
            (start < end).then(|| (i, start - slot.offset..end - slot.offset))
        })
        .collect()
}

impl FlatLayout {
    pub(super) fn check_range(&self, range: &Range<usize>) -> Result<()> {
        if range.start > range.end || range.end > self.len() {
            return Err(TensorError::Flat(format!(
                "range {range:?} is outside a layout of {} elements",
                self.len()
            )));
        }
        Ok(())
    }

    /// The values of `store`'s entries over `range` of this layout, as one 1-D tensor of
    /// `dtype` on the store's device: a copy of its own, never a view of a variable (a range
    /// inside one parameter would otherwise alias it).
    pub fn read_range(
        &self,
        store: &ParamStore,
        range: Range<usize>,
        dtype: DType,
    ) -> Result<Tensor> {
        self.check_range(&range)?;
        let values = Tensor::zeros(range.len(), dtype, store.device())?;
        for (i, within) in pieces(self, &range) {
            let slot = &self.slots()[i];
            let part = store.entries()[slot.entry]
                .tensor()
                .flatten_all()?
                .narrow(0, within.start, within.len())?
                .to_dtype(dtype)?;
            values.slice_set(&part, 0, slot.offset + within.start - range.start)?;
        }
        Ok(values)
    }

    /// Writes `values` (1-D, any dtype, on any device) over the elements
    /// `start..start + values.len()` of this layout into `store`'s variables, in place,
    /// converted to each variable's dtype. Values on another device (an offloaded optimizer's
    /// host copy) are converted to the store's dtype there and moved over in one copy.
    pub fn write_range(&self, store: &ParamStore, start: usize, values: &Tensor) -> Result<()> {
        let range = start..start + values.elem_count();
        self.check_range(&range)?;
        let moved;
        let values = match values.device().same_device(store.device()) {
            true => values,
            false => {
                moved = values.to_dtype(store.dtype())?.to_device(store.device())?;
                &moved
            }
        };
        for (i, within) in pieces(self, &range) {
            let slot = &self.slots()[i];
            let var = &store.entries()[slot.entry].var;
            let from = slot.offset + within.start - start;
            let part = values
                .narrow(0, from, within.len())?
                .to_dtype(var.dtype())?;
            var.as_tensor()
                .flatten_all()?
                .slice_set(&part, 0, within.start)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;
    use crate::params::EntryKind;

    fn store() -> ParamStore {
        let dev = Device::Cpu;
        let mut store = ParamStore::new(&dev, DType::F32);
        let a = Tensor::arange(0f32, 6.0, &dev)
            .unwrap()
            .reshape((2, 3))
            .unwrap();
        let b = Tensor::arange(6f32, 10.0, &dev).unwrap();
        store.register("a", EntryKind::Parameter, a).unwrap();
        store.register("b", EntryKind::Parameter, b).unwrap();
        store
    }

    #[test]
    fn ranges_cut_through_entries_both_ways() {
        let store = store();
        let layout = FlatLayout::parameters(&store);
        let middle = layout.read_range(&store, 4..8, DType::F64).unwrap();
        assert_eq!(middle.to_vec1::<f64>().unwrap(), vec![4.0, 5.0, 6.0, 7.0]);
        let values = Tensor::new(&[40f64, 50.0, 60.0, 70.0], &Device::Cpu).unwrap();
        layout.write_range(&store, 4, &values).unwrap();
        let all = layout.read_range(&store, 0..10, DType::F32).unwrap();
        let expected = [0.0, 1.0, 2.0, 3.0, 40.0, 50.0, 60.0, 70.0, 8.0, 9.0];
        assert_eq!(all.to_vec1::<f32>().unwrap(), expected);
        assert_eq!(
            layout
                .read_range(&store, 3..3, DType::F32)
                .unwrap()
                .elem_count(),
            0
        );
        // A range inside one parameter is a copy, not a view of it.
        let inside = layout.read_range(&store, 1..3, DType::F32).unwrap();
        layout
            .write_range(&store, 1, &(inside.clone() + 1.0).unwrap())
            .unwrap();
        assert_eq!(inside.to_vec1::<f32>().unwrap(), vec![1.0, 2.0]);
        let beyond = layout.write_range(&store, 8, &values).unwrap_err();
        assert!(beyond.to_string().contains("8..12"), "{beyond}");
    }
}
