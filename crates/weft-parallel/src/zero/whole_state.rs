//! A sharded checkpoint's whole state in memory, by parameter name: the model (parameters and
//! buffers), each optimizer state buffer and the master weights, every entry shaped like its
//! parameter. It is how a checkpoint moves between splits of a model that the sharded format
//! alone does not cover (another tensor-parallel size, another pipeline): the caller joins the
//! parts' whole states by name, then [`load_whole_state`] loads the result into a trainer of
//! any layout, each entry first cut to this rank's part by the caller's function (its
//! tensor-parallel slice, or the entry whole), then this rank's range of the flat buffers.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use weft_tensor::state_dict::load_tensors;

use super::checkpoint::{fail, read_ranges, MASTER, PARAMETERS};
use super::manifest::Manifest;
use super::ShardLayout;
use crate::error::Result;
use crate::Trainer;

/// Tensors by parameter name.
pub type Named = HashMap<String, Tensor>;

/// A checkpoint's state, whole, by parameter name.
#[derive(Debug, Clone)]
pub struct WholeState {
    /// The optimizer (`sgd`, `adamw`) and its step count.
    pub optimizer: String,
    pub step: u64,
    /// The model's parameters and buffers.
    pub model: Named,
    /// Each optimizer state buffer (`exp_avg`, …) by name, in the checkpoint's order.
    pub buffers: Vec<(String, Named)>,
    /// The master weights, when the checkpoint holds them.
    pub master: Option<Named>,
}

impl WholeState {
    /// Reads the sharded checkpoint in `dir` whole, from every shard file.
    pub fn read(dir: &Path) -> Result<Self> {
        let manifest = Manifest::read(dir)?;
        let model_file = dir.join(&manifest.model_file);
        let mut model = candle_core::safetensors::load(&model_file, &Device::Cpu)
            .map_err(|e| fail(&model_file, e))?;
        let mut names = manifest.buffers.clone();
        if manifest.master_weights {
            names.push(MASTER.into());
        }
        if manifest.parameters_in_shards {
            names.push(PARAMETERS.into());
        }
        let flats = read_ranges(dir, &manifest, &names, &(0..manifest.flat_len))?;
        let mut by_buffer = names
            .into_iter()
            .zip(flats)
            .map(|(name, flat)| Ok((name, by_entry(&manifest, &flat)?)))
            .collect::<Result<Vec<_>>>()?;
        if manifest.parameters_in_shards {
            let (_, parameters) = by_buffer.pop().expect("the parameters were read last");
            model.extend(parameters);
        }
        let master = match manifest.master_weights {
            true => by_buffer.pop().map(|(_, values)| values),
            false => None,
        };
        Ok(Self {
            optimizer: manifest.optimizer,
            step: manifest.step,
            model,
            buffers: by_buffer,
            master,
        })
    }

    /// Every map of tensors it holds: the model's, each buffer's, the master weights'.
    pub fn maps_mut(&mut self) -> impl Iterator<Item = &mut Named> {
        std::iter::once(&mut self.model)
            .chain(self.buffers.iter_mut().map(|(_, values)| values))
            .chain(self.master.iter_mut())
    }
}

/// One flat buffer of a checkpoint laid out as `manifest`'s entries, by entry name.
fn by_entry(manifest: &Manifest, flat: &Tensor) -> Result<Named> {
    manifest
        .entries
        .iter()
        .map(|e| {
            let numel = e.shape.iter().product();
            let values = flat
                .narrow(0, e.offset, numel)?
                .reshape(e.shape.as_slice())?;
            Ok((e.name.clone(), values))
        })
        .collect()
}

/// Loads `whole` (read from `dir`, named in errors) into `trainer`: every entry of the model
/// cut by `cut` (its name and whole value to this rank's part of it), and this rank's range of
/// `shards` of the optimizer state and master weights laid out in the trainer's flat buffers.
/// The model must hold exactly the trainer's entries. Every value is cut and checked before
/// anything is written.
pub fn load_whole_state(
    trainer: &mut Trainer,
    (shards, rank): (&ShardLayout, usize),
    (dir, whole): (&Path, &WholeState),
    cut: impl Fn(&str, &Tensor) -> Result<Tensor>,
) -> Result<()> {
    let model = whole
        .model
        .iter()
        .map(|(name, value)| Ok((name.clone(), cut(name, value)?)))
        .collect::<Result<Named>>()?;
    let range = shards.range(rank);
    let layout = trainer.grads().layout().clone();
    let flat = |what: &str, values: &Named| -> Result<Tensor> {
        let mut pieces = Vec::with_capacity(layout.slots().len());
        for slot in layout.slots() {
            let whole = values
                .get(&slot.name)
                .ok_or_else(|| fail(dir, format!("{what} has no {}", slot.name)))?;
            let part = cut(&slot.name, whole)?;
            if part.dims() != slot.shape.as_slice() {
                let (has, wants) = (part.dims(), &slot.shape);
                let detail = format!("{what} of {} is {has:?}, the model's {wants:?}", slot.name);
                return Err(fail(dir, detail));
            }
            pieces.push(part.flatten_all()?);
        }
        Ok(Tensor::cat(&pieces, 0)?.narrow(0, range.start, range.len())?)
    };
    let buffers = whole
        .buffers
        .iter()
        .map(|(name, values)| Ok((name.clone(), flat(name, values)?)))
        .collect::<Result<Vec<_>>>()?;
    let master = match (&whole.master, trainer.keeps_master_copy()) {
        (Some(values), true) => Some(flat(MASTER, values)?),
        _ => None,
    };
    trainer.with_full_parameters(|m| {
        Ok(load_tensors(m.store(), dir, &model, |_, v| Ok(v.clone()))?)
    })?;
    if range.is_empty() {
        return Ok(());
    }
    trainer
        .optimizer_mut()?
        .load_flat_state(&whole.optimizer, whole.step, range, buffers)?;
    match master {
        Some(master) => trainer.load_master_weights(&master),
        // Without saved master weights the copy is the model's values, loaded above.
        None => trainer.reload_master_weights(),
    }
}
