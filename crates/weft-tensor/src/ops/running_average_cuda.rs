//! Launches `bn_update_running` of `kernels/batch_norm.cu`: one batch norm's running mean,
//! running variance and batch count updated in one launch (three kernels' worth of work, and
//! a step of ResNet-50 has 53 batch norms). Writes through the addresses of storages borrowed
//! for reading, as the multi-tensor kernels do (see [`device_address`]).

use candle_core::{bail, DType, Result, Tensor};
use cudarc::driver::PushKernelArg;

use super::batch_norm_cuda::one_thread_each;
use super::cuda_launch::{device_address, function, launched, BATCH_NORM};
use super::running_average::RunningStats;

/// `stats.mean` and `stats.var` blended with `batch_mean` and `batch_var` (already of the
/// kernel's batch type: the running dtype, f32 for 16-bit) and `stats.count` raised by one.
pub(crate) fn update_running(
    stats: &RunningStats,
    batch_mean: &Tensor,
    batch_var: &Tensor,
    momentum: f64,
    var_scale: f64,
) -> Result<()> {
    if stats.count.dtype() != DType::I64 || stats.count.elem_count() != 1 {
        bail!("update_running_stats: the batch count must be one i64");
    }
    let device = stats.mean.device().as_cuda_device()?.clone();
    let func = function(
        &device,
        &BATCH_NORM,
        "bn_update_running",
        stats.mean.dtype(),
    )?;
    let n = stats.mean.elem_count();
    let len = n as i32;
    let [mean, var, count, b_mean, b_var] =
        [stats.mean, stats.var, stats.count, batch_mean, batch_var].map(device_address);
    let (mean, var, count, b_mean, b_var) = (mean?, var?, count?, b_mean?, b_var?);
    let mut builder = func.builder();
    builder
        .arg(&mean)
        .arg(&var)
        .arg(&count)
        .arg(&b_mean)
        .arg(&b_var)
        .arg(&len)
        .arg(&momentum)
        .arg(&var_scale);
    // SAFETY: the arguments match `bn_update_running` in kernels/batch_norm.cu (the addresses
    // travel as 64-bit pointers); the caller checked that the four statistics hold `n`
    // contiguous elements of the kernel's types and the count one i64.
    launched("bn_update_running", unsafe {
        builder.launch(one_thread_each(n.max(1)))
    })
}
