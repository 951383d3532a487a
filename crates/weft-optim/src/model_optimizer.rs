//! [`ModelOptimizer`]: an optimizer over a model's flat buffers, on the parameters' device.
//! On the CPU a slice optimizer ([`crate::Optimizer`], PyTorch's rule as one vectorised loop)
//! steps a flat master copy of the parameters in place inside its storage, and the values are
//! written back into the model; on a GPU (feature `cuda`) [`crate::DeviceOptimizer`] updates
//! the model's parameter tensors in place with the same rule as multi-tensor CUDA kernels.
//!
//! A step covers a range of the flat buffers: the whole of them for one process or DDP, this
//! rank's shard under ZeRO (see weft-parallel's `Strategy::optimizer_range`).

use std::ops::Range;

use candle_core::{DType, Device, Tensor};
use weft_tensor::flat::StagingElement;
use weft_tensor::{FlatBuffer, ParamStore};

use crate::host_optimizer::HostOptimizer;
use crate::update_parts::check_parts;
use crate::{AdamW, AdamWConfig, OptimError, Optimizer, ParamGroups, Real, Sgd, SgdConfig, Shard};

const NAME: &str = "model optimizer";

fn tensor_error(e: impl std::fmt::Display) -> OptimError {
    OptimError::Tensor {
        optimizer: NAME,
        reason: e.to_string(),
    }
}

/// Which optimizer, with its hyperparameters.
#[derive(Debug, Clone, PartialEq)]
pub enum OptimizerConfig {
    Sgd(SgdConfig),
    AdamW(AdamWConfig),
}

/// An optimizer over flat buffers of the model's dtype.
pub enum ModelOptimizer {
    /// A slice optimizer over an f32 flat master copy.
    F32(Box<HostOptimizer<f32>>),
    /// A slice optimizer over an f64 flat master copy.
    F64(Box<HostOptimizer<f64>>),
    /// The rule on the parameters' CUDA device, in place (no master copy).
    #[cfg(feature = "cuda")]
    Device(Box<crate::DeviceOptimizer>),
}

impl ModelOptimizer {
    /// The optimizer `config` for parameters of `dtype` on `device`, with `groups`: the CPU
    /// rule over a master copy on the CPU, the CUDA kernels on a GPU. Built for the CPU while
    /// the model is on a GPU, the optimizer is offloaded: its master copy and state stay in
    /// host memory and each step copies the gradients over and the parameters back.
    pub fn new(
        config: OptimizerConfig,
        groups: ParamGroups,
        device: &Device,
        dtype: DType,
    ) -> Result<Self, OptimError> {
        if device.is_cuda() {
            return Self::on_cuda(config, groups, device);
        }
        Ok(match (config, dtype) {
            (OptimizerConfig::Sgd(c), DType::F32) => {
                host(Sgd::<f32>::new(c)?.with_param_groups(groups), Self::F32)
            }
            (OptimizerConfig::Sgd(c), DType::F64) => {
                host(Sgd::<f64>::new(c)?.with_param_groups(groups), Self::F64)
            }
            (OptimizerConfig::AdamW(c), DType::F32) => {
                host(AdamW::<f32>::new(c)?.with_param_groups(groups), Self::F32)
            }
            (OptimizerConfig::AdamW(c), DType::F64) => {
                host(AdamW::<f64>::new(c)?.with_param_groups(groups), Self::F64)
            }
            (_, other) => {
                return Err(tensor_error(format!(
                    "parameters of dtype {other:?} on the CPU are not supported (f32, f64)"
                )))
            }
        })
    }

    /// A host optimizer over an f32 master copy stepped by `rule` (e.g. an [`Sgd`]).
    pub fn host_f32(rule: impl Optimizer<f32> + Send + 'static) -> Self {
        host(rule, Self::F32)
    }

    /// A host optimizer over an f64 master copy stepped by `rule`.
    pub fn host_f64(rule: impl Optimizer<f64> + Send + 'static) -> Self {
        host(rule, Self::F64)
    }

    #[cfg(feature = "cuda")]
    fn on_cuda(
        config: OptimizerConfig,
        groups: ParamGroups,
        device: &Device,
    ) -> Result<Self, OptimError> {
        let rule = match config {
            OptimizerConfig::Sgd(c) => crate::DeviceRule::Sgd(c),
            OptimizerConfig::AdamW(c) => crate::DeviceRule::AdamW(c),
        };
        Ok(Self::Device(Box::new(
            crate::DeviceOptimizer::new(rule, device)?.with_param_groups(groups),
        )))
    }

    #[cfg(not(feature = "cuda"))]
    fn on_cuda(_: OptimizerConfig, _: ParamGroups, _: &Device) -> Result<Self, OptimError> {
        Err(tensor_error(
            "parameters on a CUDA device need weft-optim's `cuda` feature",
        ))
    }

    /// The dtype the optimizer needs, `None` when it takes the parameters' own.
    pub fn dtype(&self) -> Option<DType> {
        match self {
            ModelOptimizer::F32(_) => Some(DType::F32),
            ModelOptimizer::F64(_) => Some(DType::F64),
            #[cfg(feature = "cuda")]
            ModelOptimizer::Device(_) => None,
        }
    }

    /// The dtype of the gradients it steps with for a model of dtype `model`: its own dtype
    /// (the master copy's); on a GPU fp32 for a 16-bit model (the kernels then keep fp32
    /// master weights and write the 16-bit copy), the model's otherwise.
    pub fn gradient_dtype(&self, model: DType) -> DType {
        match self.dtype() {
            Some(dtype) => dtype,
            None if matches!(model, DType::BF16 | DType::F16) => DType::F32,
            None => model,
        }
    }

    /// Whether the optimizer steps a flat master copy of the parameters.
    pub fn needs_master_copy(&self) -> bool {
        self.dtype().is_some()
    }

    /// Sets the learning rate of the next step (on a GPU this writes the device copy of the
    /// rate, so call it outside a captured CUDA graph).
    pub fn set_lr(&mut self, lr: f64) -> Result<(), OptimError> {
        match self {
            ModelOptimizer::F32(opt) => opt.set_lr(lr),
            ModelOptimizer::F64(opt) => opt.set_lr(lr),
            #[cfg(feature = "cuda")]
            ModelOptimizer::Device(opt) => opt.set_lr(lr),
        }
    }

    /// Number of steps taken (on a GPU, read from the device: replays of a captured step
    /// included).
    pub fn step_count(&self) -> Result<u64, OptimError> {
        match self {
            ModelOptimizer::F32(opt) => Ok(opt.step_count()),
            ModelOptimizer::F64(opt) => Ok(opt.step_count()),
            #[cfg(feature = "cuda")]
            ModelOptimizer::Device(opt) => opt.step_count(),
        }
    }

    /// Elements held in the optimizer's state buffers (momentum, moments; 0 before the first
    /// step): over the stepped range only, so a ZeRO shard's state is the shard's size.
    pub fn state_len(&self) -> usize {
        match self {
            ModelOptimizer::F32(opt) => opt.state_len(),
            ModelOptimizer::F64(opt) => opt.state_len(),
            #[cfg(feature = "cuda")]
            ModelOptimizer::Device(opt) => opt.state().iter().map(|(_, t)| t.elem_count()).sum(),
        }
    }

    /// Bytes of the optimizer's state buffers (see [`Self::state_len`]).
    pub fn state_bytes(&self) -> usize {
        match self {
            ModelOptimizer::F32(opt) => opt.state_len() * 4,
            ModelOptimizer::F64(opt) => opt.state_len() * 8,
            #[cfg(feature = "cuda")]
            ModelOptimizer::Device(opt) => opt
                .state()
                .iter()
                .map(|(_, t)| t.elem_count() * t.dtype().size_in_bytes())
                .sum(),
        }
    }

    /// Bytes of master weights the optimizer keeps itself (on a GPU, the fp32 copy of 16-bit
    /// parameters; the CPU rules step a master copy their caller keeps).
    pub fn own_master_bytes(&self) -> usize {
        match self {
            #[cfg(feature = "cuda")]
            ModelOptimizer::Device(opt) => opt.master_bytes(),
            _ => 0,
        }
    }

    /// Steps the parameters of `store` in `range` of the flat buffers with `grads`: through
    /// `master`, the flat master copy of the parameters over `range` (a 1-D tensor of the
    /// optimizer's dtype; then written into the store), or in place on the device. The
    /// optimizer's state covers `range`, which must stay the same from step to step. Where
    /// `skip` (one f32 on the gradients' device: a loss scaler's found-inf flag) is not 0,
    /// nothing changes: decided on the device by a device optimizer, read on the host by a
    /// host one.
    pub fn step(
        &mut self,
        master: Option<&Tensor>,
        grads: &FlatBuffer,
        store: &ParamStore,
        range: Range<usize>,
        skip: Option<&Tensor>,
    ) -> Result<(), OptimError> {
        #[cfg(feature = "cuda")]
        if let ModelOptimizer::Device(opt) = self {
            return opt.step(grads, store, range, skip);
        }
        if let Some(skip) = skip {
            let flag = skip
                .flatten_all()
                .and_then(|s| s.to_vec1::<f32>())
                .map_err(|e| OptimError::Tensor {
                    optimizer: NAME,
                    reason: format!("the skip flag: {e}"),
                })?;
            if flag.first().is_some_and(|&f| f != 0.0) {
                return Ok(());
            }
        }
        let master = master.ok_or(OptimError::Tensor {
            optimizer: NAME,
            reason: "this optimizer steps a flat master copy, but none was given".into(),
        })?;
        let shard = Shard {
            offset: range.start,
            buffer_len: grads.layout().len(),
        };
        self.download_gradients(grads, &range)?;
        self.step_master(master, shard)?;
        self.write_master(grads, store, range.start, master)
    }

    /// [`Self::step`] in parts: `parts` (disjoint, covering `range`) are stepped in their order,
    /// `before_part(i)` called before part `i`. On a device the gradients of a part need only be
    /// final once `before_part` has returned for it (DDP's last bucket: its all-reduce is joined
    /// there, so it runs while the earlier parts are stepped); a host optimizer calls every
    /// `before_part` first, then steps the whole range. The values are those of one step: every
    /// rule is element-wise. An error from `before_part` leaves the parts before it stepped.
    #[allow(clippy::too_many_arguments)]
    pub fn step_in_parts<E: From<OptimError>>(
        &mut self,
        master: Option<&Tensor>,
        grads: &FlatBuffer,
        store: &ParamStore,
        range: Range<usize>,
        skip: Option<&Tensor>,
        parts: &[Range<usize>],
        mut before_part: impl FnMut(usize) -> Result<(), E>,
    ) -> Result<(), E> {
        #[cfg(feature = "cuda")]
        if let ModelOptimizer::Device(opt) = self {
            return opt.step_in_parts(grads, store, range, skip, parts, before_part);
        }
        check_parts(NAME, &range, parts)?;
        for part in 0..parts.len() {
            before_part(part)?;
        }
        Ok(self.step(master, grads, store, range, skip)?)
    }

    /// Copies the elements `range` of the flat gradients into host memory (pinned on a GPU),
    /// for [`Self::step_master`]: the first part of a host optimizer's step.
    pub fn download_gradients(
        &mut self,
        grads: &FlatBuffer,
        range: &Range<usize>,
    ) -> Result<(), OptimError> {
        match self {
            ModelOptimizer::F32(opt) => opt.download(grads, range),
            ModelOptimizer::F64(opt) => opt.download(grads, range),
            #[cfg(feature = "cuda")]
            ModelOptimizer::Device(_) => Err(on_device()),
        }
    }

    /// Steps the host master copy `master` (the shard `shard` of the flat buffers) with the
    /// gradients last downloaded, leaving the model's parameters as they are: the part of a
    /// host optimizer's step that can run on a thread of its own (the delayed update).
    pub fn step_master(&mut self, master: &Tensor, shard: Shard) -> Result<(), OptimError> {
        match self {
            ModelOptimizer::F32(opt) => opt.step_master(master, shard),
            ModelOptimizer::F64(opt) => opt.step_master(master, shard),
            #[cfg(feature = "cuda")]
            ModelOptimizer::Device(_) => Err(on_device()),
        }
    }

    /// Writes the host master copy `master` (the flat buffers' elements from `start` on) into
    /// the model's variables in `store` (through pinned memory on a GPU): the last part of a
    /// host optimizer's step.
    pub fn write_master(
        &mut self,
        grads: &FlatBuffer,
        store: &ParamStore,
        start: usize,
        master: &Tensor,
    ) -> Result<(), OptimError> {
        match self {
            ModelOptimizer::F32(opt) => opt.write_master(grads, store, start, master),
            ModelOptimizer::F64(opt) => opt.write_master(grads, store, start, master),
            #[cfg(feature = "cuda")]
            ModelOptimizer::Device(_) => Err(on_device()),
        }
    }
}

/// A host optimizer over `rule`, as the variant `variant`.
fn host<T: Real + StagingElement>(
    rule: impl Optimizer<T> + Send + 'static,
    variant: fn(Box<HostOptimizer<T>>) -> ModelOptimizer,
) -> ModelOptimizer {
    variant(Box::new(HostOptimizer::new(Box::new(rule))))
}

#[cfg(feature = "cuda")]
fn on_device() -> OptimError {
    tensor_error("the optimizer runs on the device: it has no host master copy")
}
