//! Launches the kernels of `kernels/optimizers.cu`: the runs of parameter elements a step
//! updates travel by value in an [`OptimList`] of at most [`MAX_ENTRIES`] entries, one launch
//! per list, on the device's compute stream (see `weft_tensor::ops::cuda_launch` for why
//! writing through the parameters' addresses is sound).

use candle_core::{bail, DType, Result, Tensor};
use cudarc::driver::{DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg};
use weft_tensor::ops::cuda_launch::{
    device_address, function_named, launched, Kernel, Module, THREADS,
};

use crate::{AdamWConfig, SgdConfig};

include!(concat!(env!("OUT_DIR"), "/ptx.rs"));

const OPTIMIZERS: Module = Module::new("weft_optimizers", PTX_OPTIMIZERS);

/// Entries of one [`OptimList`] (as `MAX_ENTRIES` in the kernel source).
const MAX_ENTRIES: usize = 48;

/// One run of a parameter's elements: where it lies, where its gradient and state lie in the
/// flat buffers, and its param group's hyperparameters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub address: u64,
    pub offset: u64,
    pub len: u64,
    pub weight_decay: f64,
    pub lr_scale: f64,
}

/// The kernels' by-value argument, laid out as `struct OptimList` in the kernel source.
#[repr(C)]
#[derive(Clone, Copy)]
struct OptimList {
    param: [u64; MAX_ENTRIES],
    offset: [u64; MAX_ENTRIES],
    len: [u64; MAX_ENTRIES],
    weight_decay: [f64; MAX_ENTRIES],
    lr_scale: [f64; MAX_ENTRIES],
    count: u32,
}

// SAFETY: plain old data laid out as `struct OptimList` in kernels/optimizers.cu.
unsafe impl DeviceRepr for OptimList {}

impl OptimList {
    fn new(runs: &[Run]) -> Self {
        let mut list = Self {
            param: [0; MAX_ENTRIES],
            offset: [0; MAX_ENTRIES],
            len: [0; MAX_ENTRIES],
            weight_decay: [0.0; MAX_ENTRIES],
            lr_scale: [0.0; MAX_ENTRIES],
            count: runs.len() as u32,
        };
        for (i, run) in runs.iter().enumerate() {
            list.param[i] = run.address;
            list.offset[i] = run.offset;
            list.len[i] = run.len;
            list.weight_decay[i] = run.weight_decay;
            list.lr_scale[i] = run.lr_scale;
        }
        list
    }
}

/// Blocks per entry: enough for the longest run at 4 elements per thread, at most 1024 (the
/// blocks stride over longer runs).
fn launch_config(runs: &[Run]) -> LaunchConfig {
    let longest = runs.iter().map(|r| r.len).max().unwrap_or(0);
    LaunchConfig {
        grid_dim: (
            longest.div_ceil(4 * THREADS as u64).clamp(1, 1024) as u32,
            runs.len() as u32,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn suffix(dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::F64 => Ok("f64"),
        other => bail!("optimizer kernels: dtype {other:?} is not supported (f32, f64)"),
    }
}

/// The kernel `{rule}_{suffix}` for gradients of `grads`' dtype, or with fp32 master weights
/// (`master`) for parameters of the 16-bit `dtype`: `{rule}_mixed_{bf16,f16}`.
fn kernel_name(rule: &str, grads: &Tensor, master: Option<(&Tensor, DType)>) -> Result<String> {
    match master {
        None => Ok(format!("{rule}_{}", suffix(grads.dtype())?)),
        Some((_, DType::BF16)) => Ok(format!("{rule}_mixed_bf16")),
        Some((_, DType::F16)) => Ok(format!("{rule}_mixed_f16")),
        Some((_, other)) => {
            bail!("optimizer kernels: no master-weight rule for {other:?} parameters")
        }
    }
}

/// A launch of a rule's kernel for one list, with the arguments every rule takes first: the
/// list, the gradients and (with master weights) the fp32 master copy.
fn leading_args<'a>(
    func: &'a Kernel,
    list: &'a OptimList,
    grads_at: &'a u64,
    master_at: &'a Option<u64>,
) -> LaunchArgs<'a> {
    let mut builder = func.builder();
    builder.arg(list).arg(grads_at);
    if let Some(at) = master_at {
        builder.arg(at);
    }
    builder
}

/// One thread.
const SINGLE: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (1, 1, 1),
    shared_mem_bytes: 0,
};

/// `step[0] += 1` on the device (`step`: three f64, see [`advance_adamw`]) unless `skip` (one
/// f32 on the device) is not 0.
pub(crate) fn increment_step(step: &Tensor, skip: &Tensor) -> Result<()> {
    let device = step.device().as_cuda_device()?;
    let func = function_named(device, &OPTIMIZERS, "increment_step")?;
    let (at, skip_at) = (device_address(step)?, device_address(skip)?);
    let mut builder = func.builder();
    builder.arg(&at).arg(&skip_at);
    // SAFETY: `at` is the address of three f64 on the device, `skip_at` of one f32.
    launched("increment_step", unsafe { builder.launch(SINGLE) })
}

/// `step[0] += 1`, then AdamW's bias corrections of that step into `step[1]` (`1 − β1^t`) and
/// `step[2]` (`sqrt(1 − β2^t)`), once per step on the device, unless `skip` is not 0.
pub(crate) fn advance_adamw(step: &Tensor, config: &AdamWConfig, skip: &Tensor) -> Result<()> {
    let device = step.device().as_cuda_device()?;
    let func = function_named(device, &OPTIMIZERS, "advance_adamw")?;
    let (at, skip_at) = (device_address(step)?, device_address(skip)?);
    let mut builder = func.builder();
    builder
        .arg(&at)
        .arg(&config.betas.0)
        .arg(&config.betas.1)
        .arg(&skip_at);
    // SAFETY: `at` is the address of three f64 on the device, `skip_at` of one f32.
    launched("advance_adamw", unsafe { builder.launch(SINGLE) })
}

/// One SGD step of `runs` (inside the flat `grads` and `momentum`, of the runs' dtype, or
/// fp32 with `master`: the fp32 master weights of 16-bit parameters; `lr` one f64 on the
/// device, `step` the step count incremented by [`increment_step`], the first step the one
/// finding it at 1), nothing where `skip` is not 0.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgd(
    runs: &[Run],
    grads: &Tensor,
    master: Option<(&Tensor, DType)>,
    momentum: &Tensor,
    (lr, step): (&Tensor, &Tensor),
    config: &SgdConfig,
    skip: &Tensor,
) -> Result<()> {
    let device = grads.device().as_cuda_device()?;
    let func = function_named(
        device,
        &OPTIMIZERS,
        &kernel_name("multi_sgd", grads, master)?,
    )?;
    let master_at = master.map(|(m, _)| device_address(m)).transpose()?;
    let (grads_at, momentum_at, lr_at, step_at, skip_at) = (
        device_address(grads)?,
        device_address(momentum)?,
        device_address(lr)?,
        device_address(step)?,
        device_address(skip)?,
    );
    let flags = [config.nesterov, config.maximize].map(i32::from);
    for chunk in runs.chunks(MAX_ENTRIES) {
        let list = OptimList::new(chunk);
        let mut builder = leading_args(&func, &list, &grads_at, &master_at);
        builder
            .arg(&momentum_at)
            .arg(&lr_at)
            .arg(&step_at)
            .arg(&config.momentum)
            .arg(&config.dampening)
            .arg(&flags[0])
            .arg(&flags[1])
            .arg(&skip_at);
        // SAFETY: the arguments match `multi_sgd_*`; each run holds `len` elements of the
        // gradients' dtype and lies, at its offset, inside both flat buffers (checked by the
        // caller).
        launched("multi_sgd", unsafe { builder.launch(launch_config(chunk)) })?;
    }
    Ok(())
}

/// The AdamW state buffers of one step.
pub(crate) struct AdamWState<'a> {
    pub exp_avg: &'a Tensor,
    pub exp_avg_sq: &'a Tensor,
    pub max_exp_avg_sq: Option<&'a Tensor>,
}

/// One AdamW step of `runs` at step `step` (three f64 on the device, advanced by
/// [`advance_adamw`]), with fp32 master weights for 16-bit parameters when `master`; nothing
/// where `skip` is not 0.
#[allow(clippy::too_many_arguments)]
pub(crate) fn adamw(
    runs: &[Run],
    grads: &Tensor,
    master: Option<(&Tensor, DType)>,
    state: &AdamWState<'_>,
    (lr, step): (&Tensor, &Tensor),
    config: &AdamWConfig,
    skip: &Tensor,
) -> Result<()> {
    let device = grads.device().as_cuda_device()?;
    let func = function_named(
        device,
        &OPTIMIZERS,
        &kernel_name("multi_adamw", grads, master)?,
    )?;
    let master_at = master.map(|(m, _)| device_address(m)).transpose()?;
    let max_at = match state.max_exp_avg_sq {
        Some(max) => device_address(max)?,
        // Never read or written without amsgrad.
        None => device_address(state.exp_avg_sq)?,
    };
    let (grads_at, avg_at, sq_at, lr_at, step_at, skip_at) = (
        device_address(grads)?,
        device_address(state.exp_avg)?,
        device_address(state.exp_avg_sq)?,
        device_address(lr)?,
        device_address(step)?,
        device_address(skip)?,
    );
    let amsgrad = i32::from(config.amsgrad);
    for chunk in runs.chunks(MAX_ENTRIES) {
        let list = OptimList::new(chunk);
        let mut builder = leading_args(&func, &list, &grads_at, &master_at);
        builder
            .arg(&avg_at)
            .arg(&sq_at)
            .arg(&max_at)
            .arg(&lr_at)
            .arg(&step_at)
            .arg(&config.betas.0)
            .arg(&config.betas.1)
            .arg(&config.eps)
            .arg(&amsgrad)
            .arg(&skip_at);
        // SAFETY: the arguments match `multi_adamw_*`; each run holds `len` elements of the
        // gradients' dtype and lies, at its offset, inside the flat gradient and state
        // buffers (checked by the caller).
        launched("multi_adamw", unsafe {
            builder.launch(launch_config(chunk))
        })?;
    }
    Ok(())
}
