//! Flat buffers: the parameters (or gradients) of one dtype laid end to end in one contiguous
//! 1-D tensor, each entry a view `[offset, offset + numel)` into it.
//!
//! This is the unit that later layers cut up: DDP buckets are ranges of the flat gradient buffer,
//! ZeRO shards are ranges of the flat parameter, gradient and optimizer-state buffers, and the
//! optimizers of `weft-optim` run one fused loop over a flat slice. Candle allocates every
//! gradient afresh and owns each `Var`'s storage, so the flat buffer is the *master copy*:
//! [`FlatBuffer::copy_from_store`] gathers the model's values in, [`FlatBuffer::copy_to_store`]
//! writes the updated values back into the model's variables in place (one memcpy per step).
//! A flat buffer may have another dtype than the model (fp32 master weights for a bf16 model),
//! and may hold only a window of its layout ([`FlatBuffer::zeros_window`]): a ZeRO-2/3 rank's
//! shard of the gradients, or one bucket's gradients before they are reduced.

use std::ops::Range;

use candle_core::{DType, Device, Tensor};

use crate::error::{Result, TensorError};
use crate::params::{EntryId, ParamStore};

mod batch_upload;
mod host_staging;
mod host_update;
mod ranges;

pub use batch_upload::BatchUpload;
pub use host_staging::{HostStaging, StagingElement};
pub use host_update::{update_with_slice, zip_update, HostElement};

/// Where each entry lives in a flat buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatLayout {
    slots: Vec<Slot>,
    len: usize,
}

/// One entry's place in a flat buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    pub entry: EntryId,
    pub name: String,
    pub offset: usize,
    pub shape: Vec<usize>,
}

impl Slot {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.numel()
    }
}

impl FlatLayout {
    /// Lays out the given entries of `store` end to end, in the order given.
    pub fn new(store: &ParamStore, entries: &[EntryId]) -> Self {
        let mut offset = 0;
        let slots = entries
            .iter()
            .map(|&entry| {
                let e = &store.entries()[entry];
                let slot = Slot {
                    entry,
                    name: e.name.clone(),
                    offset,
                    shape: e.var.dims().to_vec(),
                };
                offset += slot.numel();
                slot
            })
            .collect();
        Self { slots, len: offset }
    }

    /// The layout of all trainable parameters of `store`, in `state_dict` order.
    pub fn parameters(store: &ParamStore) -> Self {
        Self::new(store, &store.parameter_ids())
    }

    /// Total number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// The slot of store entry `entry`, if it is in this layout.
    pub fn slot_of(&self, entry: EntryId) -> Option<&Slot> {
        self.slots.iter().find(|s| s.entry == entry)
    }
}

/// A contiguous 1-D tensor holding the elements of a [`FlatLayout`], all of them or a window.
/// Ranges and slots are named in the layout's coordinates everywhere.
#[derive(Debug, Clone)]
pub struct FlatBuffer {
    layout: FlatLayout,
    /// The elements of the layout this buffer holds.
    window: Range<usize>,
    data: Tensor,
}

impl FlatBuffer {
    /// A zero-filled buffer of every element of `layout`.
    pub fn zeros(layout: FlatLayout, dtype: DType, device: &Device) -> Result<Self> {
        let window = 0..layout.len();
        Self::zeros_window(layout, window, dtype, device)
    }

    /// A zero-filled buffer of the elements `window` of `layout` only.
    pub fn zeros_window(
        layout: FlatLayout,
        window: Range<usize>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        layout.check_range(&window)?;
        // An empty window is a view of one element: GPUs refuse empty allocations.
        let data = Tensor::zeros(window.len().max(1), dtype, device)?.narrow(0, 0, window.len())?;
        Ok(Self {
            layout,
            window,
            data,
        })
    }

    /// The elements of the layout this buffer holds.
    pub fn window(&self) -> Range<usize> {
        self.window.clone()
    }

    /// `range` of the layout in this buffer's own coordinates; an error unless the window
    /// holds all of it.
    pub fn local(&self, range: &Range<usize>) -> Result<Range<usize>> {
        if range.start < self.window.start || range.end > self.window.end || range.start > range.end
        {
            return Err(TensorError::Flat(format!(
                "elements {range:?} are not in this buffer's window {:?}",
                self.window
            )));
        }
        Ok(range.start - self.window.start..range.end - self.window.start)
    }

    /// A view of the elements `range` of the layout (shares storage).
    pub fn range(&self, range: &Range<usize>) -> Result<Tensor> {
        let local = self.local(range)?;
        Ok(self.data.narrow(0, local.start, local.len())?)
    }

    /// Adds `values` (1-D) into the elements `start..start + values.len()` of the layout.
    pub fn add_at(&self, start: usize, values: &Tensor) -> Result<()> {
        let local = self.local(&(start..start + values.elem_count()))?;
        let current = self.data.narrow(0, local.start, local.len())?;
        let sum = current.add(&values.flatten_all()?.to_dtype(self.dtype())?)?;
        self.data.slice_set(&sum, 0, local.start)?;
        Ok(())
    }

    /// A buffer holding the current values of `store`'s entries in `layout`.
    pub fn from_store(store: &ParamStore, layout: FlatLayout, dtype: DType) -> Result<Self> {
        let buffer = Self::zeros(layout, dtype, store.device())?;
        buffer.copy_from_store(store)?;
        Ok(buffer)
    }

    pub fn layout(&self) -> &FlatLayout {
        &self.layout
    }

    /// The buffer as a 1-D tensor (shares storage): the elements of its window.
    pub fn tensor(&self) -> &Tensor {
        &self.data
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// A view of one slot, shaped like its entry (shares storage).
    pub fn view(&self, slot: &Slot) -> Result<Tensor> {
        Ok(self.range(&slot.range())?.reshape(slot.shape.as_slice())?)
    }

    /// Overwrites `slot` with `value` (any shape with the right number of elements).
    pub fn write(&self, slot: &Slot, value: &Tensor) -> Result<()> {
        self.check_numel(slot, value)?;
        let local = self.local(&slot.range())?;
        let value = value.to_dtype(self.dtype())?.flatten_all()?.contiguous()?;
        self.data.slice_set(&value, 0, local.start)?;
        Ok(())
    }

    /// Overwrites several slots at once (one CUDA launch per 48 slots, see
    /// [`crate::ops::copy_tensors`]): a block's gradients the moment backward produced them.
    pub fn write_many(&self, values: &[(&Slot, &Tensor)]) -> Result<()> {
        let mut sources = Vec::with_capacity(values.len());
        let mut views = Vec::with_capacity(values.len());
        for (slot, value) in values {
            self.check_numel(slot, value)?;
            sources.push(match crate::ops::copies_into(value.dtype(), self.dtype()) {
                true => (*value).clone(),
                false => value.to_dtype(self.dtype())?,
            });
            views.push(self.range(&slot.range())?);
        }
        let pairs: Vec<(&Tensor, &Tensor)> = sources.iter().zip(&views).collect();
        crate::ops::copy_tensors(&pairs)?;
        Ok(())
    }

    /// Adds `value` into `slot` (gradient accumulation over micro-batches).
    pub fn accumulate(&self, slot: &Slot, value: &Tensor) -> Result<()> {
        self.check_numel(slot, value)?;
        self.add_at(slot.offset, value)
    }

    fn check_numel(&self, slot: &Slot, value: &Tensor) -> Result<()> {
        if value.elem_count() != slot.numel() {
            return Err(TensorError::Flat(format!(
                "`{}` has {} elements, the value written has {}",
                slot.name,
                slot.numel(),
                value.elem_count()
            )));
        }
        Ok(())
    }

    /// Sets every element to zero.
    pub fn zero(&self) -> Result<()> {
        let zeros = self.data.zeros_like()?;
        self.data.slice_set(&zeros, 0, 0)?;
        Ok(())
    }

    /// Copies the current values of the store's entries into the buffer.
    pub fn copy_from_store(&self, store: &ParamStore) -> Result<()> {
        for slot in self.layout.slots() {
            self.write(slot, store.entries()[slot.entry].tensor())?;
        }
        Ok(())
    }

    /// Writes the buffer's values into the store's variables, in place (one CUDA launch per
    /// 48 entries, see [`crate::ops::copy_tensors`]).
    pub fn copy_to_store(&self, store: &ParamStore) -> Result<()> {
        let values = self
            .layout
            .slots()
            .iter()
            .map(|slot| {
                let var = &store.entries()[slot.entry].var;
                Ok(self.view(slot)?.to_dtype(var.dtype())?)
            })
            .collect::<Result<Vec<_>>>()?;
        let pairs: Vec<(&Tensor, &Tensor)> = values
            .iter()
            .zip(self.layout.slots())
            .map(|(value, slot)| (value, store.entries()[slot.entry].tensor()))
            .collect();
        crate::ops::copy_tensors(&pairs)?;
        Ok(())
    }

    /// The values as a host vector (copies).
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        Ok(self.data.to_dtype(DType::F64)?.to_vec1()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::EntryKind;

    fn two_param_store() -> ParamStore {
        let mut store = ParamStore::new(&Device::Cpu, DType::F32);
        let dev = Device::Cpu;
        store
            .register(
                "w",
                EntryKind::Parameter,
                Tensor::new(&[[1f32, 2.], [3., 4.]], &dev).unwrap(),
            )
            .unwrap();
        store
            .register(
                "stat",
                EntryKind::Buffer,
                Tensor::new(&[9f32], &dev).unwrap(),
            )
            .unwrap();
        store
            .register(
                "b",
                EntryKind::Parameter,
                Tensor::new(&[5f32, 6.], &dev).unwrap(),
            )
            .unwrap();
        store
    }

    #[test]
    fn layout_places_parameters_end_to_end_and_skips_buffers() {
        let store = two_param_store();
        let layout = FlatLayout::parameters(&store);
        assert_eq!(layout.len(), 6);
        let names: Vec<_> = layout
            .slots()
            .iter()
            .map(|s| (s.name.as_str(), s.offset))
            .collect();
        assert_eq!(names, [("w", 0), ("b", 4)]);
    }

    #[test]
    fn gather_update_scatter_round_trip() {
        let store = two_param_store();
        let params =
            FlatBuffer::from_store(&store, FlatLayout::parameters(&store), DType::F32).unwrap();
        assert_eq!(params.to_vec_f64().unwrap(), [1., 2., 3., 4., 5., 6.]);
        let grads = FlatBuffer::zeros(params.layout().clone(), DType::F32, &Device::Cpu).unwrap();
        let b_slot = grads.layout().slots()[1].clone();
        grads
            .write(&b_slot, &Tensor::new(&[1f32, 1.], &Device::Cpu).unwrap())
            .unwrap();
        grads
            .accumulate(&b_slot, &Tensor::new(&[0.5f32, 2.], &Device::Cpu).unwrap())
            .unwrap();
        assert_eq!(grads.to_vec_f64().unwrap(), [0., 0., 0., 0., 1.5, 3.]);
        params
            .update_with(&grads, 0..6, |p: &mut [f32], g: &[f32]| {
                p.iter_mut().zip(g).for_each(|(p, g)| *p -= *g)
            })
            .unwrap();
        params.copy_to_store(&store).unwrap();
        let b: Vec<f32> = store.get("b").unwrap().tensor().to_vec1().unwrap();
        assert_eq!(b, [3.5, 3.]);
        assert_eq!(params.view(&b_slot).unwrap().dims(), &[2]);
        grads.zero().unwrap();
        assert_eq!(grads.to_vec_f64().unwrap(), [0.; 6]);
    }

    #[test]
    fn a_window_holds_its_elements_in_the_layouts_coordinates() {
        let store = two_param_store();
        let layout = FlatLayout::parameters(&store);
        let window =
            FlatBuffer::zeros_window(layout.clone(), 4..6, DType::F32, &Device::Cpu).unwrap();
        assert_eq!(window.tensor().elem_count(), 2);
        let (w, b) = (&layout.slots()[0], &layout.slots()[1]);
        window
            .write(b, &Tensor::new(&[1f32, 2.], &Device::Cpu).unwrap())
            .unwrap();
        window
            .add_at(5, &Tensor::new(&[10f32], &Device::Cpu).unwrap())
            .unwrap();
        assert_eq!(window.to_vec_f64().unwrap(), [1., 12.]);
        assert_eq!(window.local(&(4..6)).unwrap(), 0..2);
        assert_eq!(
            window.range(&(5..6)).unwrap().to_vec1::<f32>().unwrap(),
            [12.]
        );
        // A slot outside the window is an error naming the elements, not a silent write.
        let err = window.write(w, &Tensor::zeros(4, DType::F32, &Device::Cpu).unwrap());
        assert!(err.unwrap_err().to_string().contains("0..4"));
        assert!(window.range(&(3..5)).is_err());
        assert!(FlatBuffer::zeros_window(layout, 4..7, DType::F32, &Device::Cpu).is_err());
    }

    #[test]
    fn wrong_sizes_are_errors_naming_the_entry() {
        let store = two_param_store();
        let params =
            FlatBuffer::from_store(&store, FlatLayout::parameters(&store), DType::F32).unwrap();
        let slot = params.layout().slots()[0].clone();
        let err = params
            .write(&slot, &Tensor::new(&[1f32], &Device::Cpu).unwrap())
            .unwrap_err();
        assert!(err.to_string().contains("`w` has 4 elements"), "{err}");
        let err = params
            .update_with(&params.clone(), 0..7, |_: &mut [f32], _: &[f32]| {})
            .unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
    }

    #[test]
    fn master_buffer_can_have_another_dtype_than_the_model() {
        let store = two_param_store();
        let master =
            FlatBuffer::from_store(&store, FlatLayout::parameters(&store), DType::F64).unwrap();
        assert_eq!(master.dtype(), DType::F64);
        master.copy_to_store(&store).unwrap();
        assert_eq!(store.get("w").unwrap().var.dtype(), DType::F32);
    }
}
