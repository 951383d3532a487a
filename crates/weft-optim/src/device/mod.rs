//! [`DeviceOptimizer`]: SGD and AdamW on the parameters' CUDA device, updating the model's
//! parameter tensors in place with their gradients and states in flat buffers, one
//! multi-tensor kernel launch per 48 runs of elements (`kernels/optimizers.cu`). Nothing goes
//! through the host: the learning rate and the step count live on the device, so a step
//! captured in a CUDA graph replays with each step's schedule and bias corrections. The rules
//! are those of [`crate::Sgd`] and [`crate::AdamW`], operation for operation.

mod launch;
mod state;

use std::ops::Range;

use candle_core::{DType, Device, Tensor};
use weft_tensor::ops::cuda_launch::device_address;
use weft_tensor::{FlatBuffer, ParamStore};

use crate::update_parts::check_parts;
use crate::{validate, AdamWConfig, OptimError, ParamGroups, SgdConfig};
use launch::{AdamWState, Run};
use state::{is_mixed, master_weights};

/// Which rule a [`DeviceOptimizer`] runs.
#[derive(Debug, Clone, PartialEq)]
pub enum DeviceRule {
    Sgd(SgdConfig),
    AdamW(AdamWConfig),
}

impl DeviceRule {
    fn name(&self) -> &'static str {
        match self {
            DeviceRule::Sgd(_) => "sgd",
            DeviceRule::AdamW(_) => "adamw",
        }
    }

    /// The state buffers, in the order [`DeviceOptimizer`] keeps them.
    pub(crate) fn buffer_names(&self) -> &'static [&'static str] {
        match self {
            DeviceRule::Sgd(c) if c.momentum != 0.0 => &["momentum_buffer"],
            DeviceRule::Sgd(_) => &[],
            DeviceRule::AdamW(c) if c.amsgrad => &["exp_avg", "exp_avg_sq", "max_exp_avg_sq"],
            DeviceRule::AdamW(_) => &["exp_avg", "exp_avg_sq"],
        }
    }

    fn lr(&self) -> f64 {
        match self {
            DeviceRule::Sgd(c) => c.lr,
            DeviceRule::AdamW(c) => c.lr,
        }
    }

    fn weight_decay(&self) -> f64 {
        match self {
            DeviceRule::Sgd(c) => c.weight_decay,
            DeviceRule::AdamW(c) => c.weight_decay,
        }
    }
}

fn tensor_error(optimizer: &'static str) -> impl Fn(candle_core::Error) -> OptimError {
    move |e| OptimError::Tensor {
        optimizer,
        reason: e.to_string(),
    }
}

/// The name of the fp32 master weights among a device optimizer's state buffers.
pub const MASTER_WEIGHTS: &str = "master_weights";

/// What a step's launches need: the runs of each part, the flat gradients over the range, and
/// the skip flag.
struct Prepared {
    runs: Vec<Vec<Run>>,
    flat: Tensor,
    skip: Tensor,
}

/// An optimizer whose state and scalars live on the parameters' CUDA device.
pub struct DeviceOptimizer {
    rule: DeviceRule,
    device: Device,
    groups: ParamGroups,
    lr: f64,
    /// The learning rate as one f64 on the device, rewritten by [`Self::set_lr`].
    lr_value: Option<Tensor>,
    /// Steps taken, as f64 on the device (incremented there, also by graph replays), followed
    /// by AdamW's bias corrections of that step.
    step_value: Option<Tensor>,
    /// Steps issued from the host (replays of a captured step are not counted here).
    issued: u64,
    /// The state buffers over the stepped range (none before the first step).
    state: Vec<Tensor>,
    range: Option<Range<usize>>,
    /// For 16-bit parameters with fp32 gradients: the fp32 master weights over the range
    /// (made from the parameters at the first step), and the parameters' dtype.
    master: Option<(Tensor, DType)>,
    /// Master weights loaded from a checkpoint, taken in place of the parameters' values
    /// when the master copy is made at the next step.
    loaded_master: Option<Tensor>,
    /// A zero f32 on the device: the skip flag of steps without one.
    no_skip: Option<Tensor>,
}

impl DeviceOptimizer {
    /// Validates the configuration (the CPU rules' checks); the parameters live on `device`.
    pub fn new(rule: DeviceRule, device: &Device) -> Result<Self, OptimError> {
        match &rule {
            DeviceRule::Sgd(c) => drop(crate::Sgd::<f32>::new(c.clone())?),
            DeviceRule::AdamW(c) => drop(crate::AdamW::<f32>::new(c.clone())?),
        }
        Ok(Self {
            lr: rule.lr(),
            rule,
            device: device.clone(),
            groups: ParamGroups::default(),
            lr_value: None,
            step_value: None,
            issued: 0,
            state: Vec::new(),
            range: None,
            master: None,
            loaded_master: None,
            no_skip: None,
        })
    }

    /// Uses `groups` (ranges of the whole flat buffer) for per-range weight decay and lr scale.
    pub fn with_param_groups(mut self, groups: ParamGroups) -> Self {
        self.groups = groups;
        self
    }

    pub fn rule(&self) -> &DeviceRule {
        &self.rule
    }

    /// `sgd` or `adamw`, as the CPU rules name their state.
    pub fn optimizer_name(&self) -> &'static str {
        self.rule.name()
    }

    pub fn lr(&self) -> f64 {
        self.lr
    }

    /// Sets the base learning rate (finite, `>= 0`), writing the device copy when the value
    /// changes: call it outside a CUDA graph capture.
    pub fn set_lr(&mut self, lr: f64) -> Result<(), OptimError> {
        validate::non_negative(self.rule.name(), "lr", lr)?;
        // The device copy always holds `self.lr`: the same value needs no write (two kernels
        // between steps on a GPU).
        if lr.to_bits() == self.lr.to_bits() {
            return Ok(());
        }
        self.lr = lr;
        if let Some(value) = &self.lr_value {
            let fresh = Tensor::full(lr, 1, value.device()).map_err(tensor_error("lr"))?;
            value.slice_set(&fresh, 0, 0).map_err(tensor_error("lr"))?;
        }
        Ok(())
    }

    /// Steps taken: the device's count (waits for the device), which includes replays of a
    /// captured step.
    pub fn step_count(&self) -> Result<u64, OptimError> {
        match &self.step_value {
            Some(step) => {
                let values = step.to_vec1::<f64>().map_err(tensor_error("step"))?;
                Ok(values[0] as u64)
            }
            None => Ok(self.issued),
        }
    }

    /// One update of the parameters of `store` in `range` of the flat buffers, with `grads`
    /// (of the parameters' dtype, on their CUDA device); none, on the device, where `skip`
    /// (one f32 there: a loss scaler's found-inf flag) is not 0. The range must stay the same
    /// from step to step. On error nothing is launched.
    pub fn step(
        &mut self,
        grads: &FlatBuffer,
        store: &ParamStore,
        range: Range<usize>,
        skip: Option<&Tensor>,
    ) -> Result<(), OptimError> {
        let whole = [range.clone()];
        self.step_in_parts(grads, store, range, skip, &whole, |_| Ok(()))
    }

    /// [`Self::step`] with its kernels launched part by part: `parts` (disjoint, covering
    /// `range`) in their order, `before_part(i)` called before part `i`'s launches, so a part's
    /// gradients need only be final on the device's stream from there on. The step count
    /// advances once, before the first part. When the checks fail nothing is launched; an
    /// error from `before_part` leaves the parts before it stepped.
    pub fn step_in_parts<E: From<OptimError>>(
        &mut self,
        grads: &FlatBuffer,
        store: &ParamStore,
        range: Range<usize>,
        skip: Option<&Tensor>,
        parts: &[Range<usize>],
        mut before_part: impl FnMut(usize) -> Result<(), E>,
    ) -> Result<(), E> {
        let err = tensor_error(self.rule.name());
        let Prepared { runs, flat, skip } = self.prepare(grads, store, &range, skip, parts)?;
        let (lr, step) = (
            self.lr_value.as_ref().expect("made above"),
            self.step_value.as_ref().expect("made above"),
        );
        match &self.rule {
            DeviceRule::Sgd(_) => launch::increment_step(step, &skip).map_err(&err)?,
            DeviceRule::AdamW(config) => {
                launch::advance_adamw(step, config, &skip).map_err(&err)?
            }
        }
        self.issued += 1;
        let master = self.master.as_ref().map(|(m, d)| (m, *d));
        for (part, runs) in runs.iter().enumerate() {
            before_part(part)?;
            match &self.rule {
                DeviceRule::Sgd(config) => {
                    // Without momentum the buffer is never read or written.
                    let momentum = self.state.first().unwrap_or(&flat);
                    launch::sgd(runs, &flat, master, momentum, (lr, step), config, &skip)
                        .map_err(&err)?;
                }
                DeviceRule::AdamW(config) => {
                    let state = AdamWState {
                        exp_avg: &self.state[0],
                        exp_avg_sq: &self.state[1],
                        max_exp_avg_sq: self.state.get(2),
                    };
                    launch::adamw(runs, &flat, master, &state, (lr, step), config, &skip)
                        .map_err(&err)?;
                }
            }
        }
        Ok(())
    }

    /// The checks of a step and what its launches need, the state made at the first step.
    fn prepare(
        &mut self,
        grads: &FlatBuffer,
        store: &ParamStore,
        range: &Range<usize>,
        skip: Option<&Tensor>,
        parts: &[Range<usize>],
    ) -> Result<Prepared, OptimError> {
        let optimizer = self.rule.name();
        let err = tensor_error(optimizer);
        if range.end > grads.layout().len() || range.start > range.end {
            return Err(OptimError::Tensor {
                optimizer,
                reason: format!(
                    "range {range:?} is outside the flat buffers ({} elements)",
                    grads.layout().len()
                ),
            });
        }
        if let Some(previous) = self.range.as_ref().filter(|r| *r != range) {
            return Err(OptimError::Tensor {
                optimizer,
                reason: format!("the state covers {previous:?}, the step {range:?}"),
            });
        }
        check_parts(optimizer, range, parts)?;
        let runs = parts
            .iter()
            .map(|part| self.runs(grads, store, range, part))
            .collect::<Result<Vec<_>, _>>()?;
        if self.master.is_none() {
            let loaded = self.loaded_master.take();
            self.master = master_weights(grads, store, range, loaded).map_err(&err)?;
        }
        let flat = grads.range(range).map_err(|e| OptimError::Tensor {
            optimizer,
            reason: e.to_string(),
        })?;
        let device = flat.device().clone();
        if let Some(skip) = skip.filter(|s| s.dtype() != DType::F32 || s.elem_count() != 1) {
            return Err(OptimError::Tensor {
                optimizer,
                reason: format!(
                    "the skip flag must be one f32, got {:?} {:?}",
                    skip.dims(),
                    skip.dtype()
                ),
            });
        }
        if self.no_skip.is_none() {
            self.no_skip = Some(Tensor::zeros(1, DType::F32, &device).map_err(&err)?);
        }
        let skip = skip.or(self.no_skip.as_ref()).expect("made above").clone();
        if self.state.is_empty() {
            self.state = self
                .rule
                .buffer_names()
                .iter()
                .map(|_| Tensor::zeros(range.len(), flat.dtype(), &device))
                .collect::<candle_core::Result<_>>()
                .map_err(&err)?;
        }
        if self.lr_value.is_none() {
            self.lr_value = Some(Tensor::full(self.lr, 1, &device).map_err(&err)?);
        }
        if self.step_value.is_none() {
            self.step_value = Some(Tensor::zeros(3, DType::F64, &device).map_err(&err)?);
        }
        self.range = Some(range.clone());
        Ok(Prepared { runs, flat, skip })
    }

    /// The runs of parameter elements in `part` of `range`, cut at param-group boundaries,
    /// with offsets relative to the range's start.
    fn runs(
        &self,
        grads: &FlatBuffer,
        store: &ParamStore,
        range: &Range<usize>,
        part: &Range<usize>,
    ) -> Result<Vec<Run>, OptimError> {
        let optimizer = self.rule.name();
        let segments = self
            .groups
            .restricted_to(range.clone())
            .segments(range.len(), self.rule.weight_decay())?;
        let mut runs = Vec::new();
        for slot in grads.layout().slots() {
            let param = store.entries()[slot.entry].tensor();
            if param.dtype() != grads.dtype() && !is_mixed(param.dtype(), grads.dtype()) {
                return Err(OptimError::Tensor {
                    optimizer,
                    reason: format!(
                        "`{}` is {:?}, its gradients {:?}",
                        slot.name,
                        param.dtype(),
                        grads.dtype()
                    ),
                });
            }
            let base = device_address(param).map_err(tensor_error(optimizer))?;
            let elem = param.dtype().size_in_bytes() as u64;
            for segment in &segments {
                // The segment in whole-buffer coordinates, intersected with the slot.
                let start = (segment.range.start + range.start)
                    .max(slot.offset)
                    .max(part.start);
                let end = (segment.range.end + range.start)
                    .min(slot.offset + slot.numel())
                    .min(part.end);
                if start >= end {
                    continue;
                }
                runs.push(Run {
                    address: base + (start - slot.offset) as u64 * elem,
                    offset: (start - range.start) as u64,
                    len: (end - start) as u64,
                    weight_decay: segment.weight_decay,
                    lr_scale: segment.lr_scale,
                });
            }
        }
        Ok(runs)
    }
}
