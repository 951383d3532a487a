//! Launches `kernels/unscale.cu` on a CUDA storage: one grid-stride pass over the range, the
//! flag written into the caller's zeroed one-element f32 tensor; and the loss scaler's update of
//! its state on the device.

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, Tensor, WithDType};
use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::cuda_launch::{
    device_address, function, function_named, grid_stride, launched, UNSCALE,
};
use super::unscale::Factor;

fn launch<T: CudaDType + DeviceRepr + WithDType>(
    storage: &mut CudaStorage,
    range: std::ops::Range<usize>,
    factor: &Factor,
    found: u64,
) -> Result<()> {
    let device = storage.device.clone();
    let n = range.len();
    let mut grads = storage.as_cuda_slice_mut::<T>()?.slice_mut(range);
    let kernel = match factor {
        Factor::Inverse(_) => "unscale_check",
        Factor::InverseOf(_) => "unscale_check_by",
    };
    let func = function(&device, &UNSCALE, kernel, T::DTYPE)?;
    let mut builder = func.builder();
    let len = n as i64;
    builder.arg(&mut grads).arg(&len);
    let (inverse, state);
    match factor {
        Factor::Inverse(value) => {
            inverse = *value;
            builder.arg(&inverse);
        }
        Factor::InverseOf(tensor) => {
            state = device_address(tensor)?;
            builder.arg(&state);
        }
    }
    builder.arg(&found);
    // SAFETY: the arguments match `unscale_check[_by]` in kernels/unscale.cu: `grads` holds
    // `n` elements; `found` (and `state`) are addresses of live tensors on this device (one f32;
    // an f64 vector, checked by the caller), used on the compute stream after everything
    // queued on it.
    launched(kernel, unsafe { builder.launch(grid_stride(n)) })
}

/// Unscales the contiguous elements `layout` addresses in `storage` and raises `found`.
pub(crate) fn run(
    storage: &mut CudaStorage,
    layout: &Layout,
    factor: &Factor,
    found: &Tensor,
) -> Result<()> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        bail!("unscale_and_check: the gradients must be contiguous");
    };
    if found.dtype() != DType::F32 || found.elem_count() != 1 {
        bail!("unscale_and_check: the flag must be one f32");
    }
    let found = device_address(found)?;
    match storage.dtype() {
        DType::F32 => launch::<f32>(storage, start..end, factor, found),
        DType::F64 => launch::<f64>(storage, start..end, factor, found),
        DType::BF16 => launch::<half::bf16>(storage, start..end, factor, found),
        DType::F16 => launch::<half::f16>(storage, start..end, factor, found),
        other => bail!("unscale_and_check: gradients of dtype {other:?} are not supported"),
    }
}

/// The loss scaler's rule on its f64 `state` (`kernels/unscale.cu`'s `loss_scale_update`), one
/// thread, from the f32 flag `found`.
pub(crate) fn update_scale(
    state: &Tensor,
    found: &Tensor,
    (growth, backoff, interval): (f64, f64, f64),
) -> Result<()> {
    let device = state.device().as_cuda_device()?.clone();
    let func = function_named(&device, &UNSCALE, "loss_scale_update")?;
    let (state_at, found_at) = (device_address(state)?, device_address(found)?);
    let mut builder = func.builder();
    builder
        .arg(&state_at)
        .arg(&found_at)
        .arg(&growth)
        .arg(&backoff)
        .arg(&interval);
    let one = cudarc::driver::LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `loss_scale_update` in kernels/unscale.cu; `state` is a live
    // f64 tensor of four elements and `found` a live f32 one on this device (checked by the
    // caller), written and read on the compute stream in order.
    launched("loss_scale_update", unsafe { builder.launch(one) })
}
