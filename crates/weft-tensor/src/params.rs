//! The parameter store: named trainable parameters and buffers in PyTorch `state_dict()` order.
//!
//! Names follow PyTorch (`layer1.0.conv1.weight`, `bn1.running_mean`), so a torchvision
//! state dict exported to safetensors loads directly. Parameters are Candle [`Var`]s; buffers
//! (BatchNorm running statistics, `num_batches_tracked`) are stored the same way but are never
//! handed to the optimizer.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, Var};

use crate::error::{Result, TensorError};

/// Whether an entry is trained by the optimizer or is a buffer (state that is not trained).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Parameter,
    Buffer,
}

/// Index of an entry in its [`ParamStore`], stable for the store's lifetime.
pub type EntryId = usize;

/// One named parameter or buffer.
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    pub kind: EntryKind,
    pub var: Var,
}

impl Entry {
    /// The tensor behind this entry (shares storage with the variable).
    pub fn tensor(&self) -> &Tensor {
        self.var.as_tensor()
    }
}

/// Ordered collection of parameters and buffers, in registration (= `state_dict`) order.
#[derive(Debug, Clone)]
pub struct ParamStore {
    device: Device,
    dtype: DType,
    entries: Vec<Entry>,
    index: HashMap<String, EntryId>,
}

impl ParamStore {
    /// An empty store whose floating-point entries are created with `dtype` on `device`.
    pub fn new(device: &Device, dtype: DType) -> Self {
        Self {
            device: device.clone(),
            dtype,
            entries: Vec::new(),
            index: HashMap::new(),
        }
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The floating-point dtype of the parameters.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// A builder that registers entries under `prefix` (e.g. `"layer1.0"`).
    pub fn scope(&mut self, prefix: &str) -> Scope<'_> {
        Scope {
            store: self,
            prefix: prefix.to_string(),
        }
    }

    /// Registers `value` under `name`; the store keeps the variable and returns a handle to it.
    pub fn register(&mut self, name: &str, kind: EntryKind, value: Tensor) -> Result<Var> {
        if self.index.contains_key(name) {
            return Err(TensorError::DuplicateName { name: name.into() });
        }
        let var = Var::from_tensor(&value)?;
        crate::sharded_init::on_register(&var, kind)?;
        self.index.insert(name.to_string(), self.entries.len());
        self.entries.push(Entry {
            name: name.to_string(),
            kind,
            var: var.clone(),
        });
        Ok(var)
    }

    /// All entries in `state_dict` order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The id of the entry called `name`.
    pub fn id(&self, name: &str) -> Result<EntryId> {
        self.index
            .get(name)
            .copied()
            .ok_or_else(|| TensorError::UnknownName { name: name.into() })
    }

    /// The entry called `name`.
    pub fn get(&self, name: &str) -> Result<&Entry> {
        Ok(&self.entries[self.id(name)?])
    }

    /// Ids of the trainable parameters, in order.
    pub fn parameter_ids(&self) -> Vec<EntryId> {
        self.ids_of(EntryKind::Parameter)
    }

    /// Ids of the buffers, in order.
    pub fn buffer_ids(&self) -> Vec<EntryId> {
        self.ids_of(EntryKind::Buffer)
    }

    fn ids_of(&self, kind: EntryKind) -> Vec<EntryId> {
        (0..self.entries.len())
            .filter(|&i| self.entries[i].kind == kind)
            .collect()
    }

    /// Number of trainable scalar values (what PyTorch's `sum(p.numel() for p in parameters())` counts).
    pub fn num_parameters(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| e.kind == EntryKind::Parameter)
            .map(|e| e.var.elem_count())
            .sum()
    }

    /// Copies every entry's value from `other` (same names and shapes), e.g. to clone a model.
    pub fn copy_from(&self, other: &ParamStore) -> Result<()> {
        for entry in &self.entries {
            let src = other.get(&entry.name)?;
            entry.var.set(
                &src.tensor()
                    .to_device(&self.device)?
                    .to_dtype(entry.var.dtype())?,
            )?;
        }
        Ok(())
    }
}

/// Registers entries under a name prefix, like candle-nn's `VarBuilder::pp`.
pub struct Scope<'a> {
    store: &'a mut ParamStore,
    prefix: String,
}

impl Scope<'_> {
    /// A nested scope: `scope("layer1").sub("0")` registers under `layer1.0.`.
    pub fn sub(&mut self, name: &str) -> Scope<'_> {
        Scope {
            prefix: self.full_name(name),
            store: self.store,
        }
    }

    fn full_name(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{}", self.prefix, name)
        }
    }

    pub fn device(&self) -> Device {
        self.store.device.clone()
    }

    pub fn dtype(&self) -> DType {
        self.store.dtype
    }

    /// Registers a trainable parameter.
    pub fn parameter(&mut self, name: &str, value: Tensor) -> Result<Var> {
        let full = self.full_name(name);
        self.store.register(&full, EntryKind::Parameter, value)
    }

    /// Registers a buffer (state saved with the model but not trained).
    pub fn buffer(&mut self, name: &str, value: Tensor) -> Result<Var> {
        let full = self.full_name(name);
        self.store.register(&full, EntryKind::Buffer, value)
    }

    /// Number of entries registered so far in the whole store (to delimit a block's entries).
    pub fn store_len(&self) -> usize {
        self.store.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoped_names_and_kinds_keep_registration_order() {
        let mut store = ParamStore::new(&Device::Cpu, DType::F32);
        {
            let mut root = store.scope("");
            let mut layer = root.sub("layer1");
            let mut block = layer.sub("0");
            block
                .parameter(
                    "weight",
                    Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap(),
                )
                .unwrap();
            block
                .buffer(
                    "running_mean",
                    Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap(),
                )
                .unwrap();
        }
        let names: Vec<_> = store.entries().iter().map(|e| e.name.clone()).collect();
        assert_eq!(names, ["layer1.0.weight", "layer1.0.running_mean"]);
        assert_eq!(store.parameter_ids(), vec![0]);
        assert_eq!(store.buffer_ids(), vec![1]);
        assert_eq!(store.num_parameters(), 3);
    }

    #[test]
    fn duplicate_and_unknown_names_are_errors_naming_the_key() {
        let mut store = ParamStore::new(&Device::Cpu, DType::F32);
        let t = Tensor::zeros(1, DType::F32, &Device::Cpu).unwrap();
        store
            .register("a", EntryKind::Parameter, t.clone())
            .unwrap();
        let err = store.register("a", EntryKind::Parameter, t).unwrap_err();
        assert!(err.to_string().contains("`a`"), "{err}");
        let err = store.get("b").unwrap_err();
        assert!(err.to_string().contains("`b`"), "{err}");
    }
}
