//! Launches `kernels/unscale.cu` on a CUDA storage: one grid-stride pass over the range, the
//! flag written into the caller's zeroed one-element f32 tensor.

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, Tensor, WithDType};
use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::cuda_launch::{device_address, function, grid_stride, launched, UNSCALE};

fn launch<T: CudaDType + DeviceRepr + WithDType>(
    storage: &mut CudaStorage,
    range: std::ops::Range<usize>,
    inverse_scale: f64,
    found: u64,
) -> Result<()> {
    let device = storage.device.clone();
    let n = range.len();
    let mut grads = storage.as_cuda_slice_mut::<T>()?.slice_mut(range);
    let func = function(&device, &UNSCALE, "unscale_check", T::DTYPE)?;
    let mut builder = func.builder();
    let len = n as i64;
    builder
        .arg(&mut grads)
        .arg(&len)
        .arg(&inverse_scale)
        .arg(&found);
    // SAFETY: the arguments match `unscale_check` in kernels/unscale.cu: `grads` holds `n`
    // elements, and `found` is the address of a live one-element f32 tensor on this device
    // (written on the compute stream, after everything queued on it).
    launched("unscale_check", unsafe { builder.launch(grid_stride(n)) })
}

/// Unscales the contiguous elements `layout` addresses in `storage` and raises `found`.
pub(crate) fn run(
    storage: &mut CudaStorage,
    layout: &Layout,
    inverse_scale: f64,
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
        DType::F32 => launch::<f32>(storage, start..end, inverse_scale, found),
        DType::F64 => launch::<f64>(storage, start..end, inverse_scale, found),
        DType::BF16 => launch::<half::bf16>(storage, start..end, inverse_scale, found),
        DType::F16 => launch::<half::f16>(storage, start..end, inverse_scale, found),
        other => bail!("unscale_and_check: gradients of dtype {other:?} are not supported"),
    }
}
