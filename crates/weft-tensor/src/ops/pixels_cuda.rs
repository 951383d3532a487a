//! Launches `normalize_pixels` of `kernels/pixels.cu`: a grid-stride loop, a thread per four
//! pixels, from the bytes into a new buffer or into a tensor that exists (a trainer's static
//! input buffer, see `normalize_pixels_into`).

use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::cuda_backend::CudaDevice;
use candle_core::{bail, DType, Layout, Result, Tensor, WithDType};
use cudarc::driver::{DevicePtr, DeviceRepr, PushKernelArg};
use half::{bf16, f16};

use super::cuda_launch::{
    device_address, device_of, function, grid_stride, launched, output, view, PIXELS,
};
use super::pixels::PixelNormalization;

/// The kernel for `T` from the bytes at `src` into the `3 × pixels` elements at `dst`.
fn launch<T: CudaDType + WithDType>(
    device: &CudaDevice,
    (src, dst): (u64, u64),
    pixels: u64,
    normalization: Option<PixelNormalization>,
) -> Result<()> {
    let name = "normalize_pixels";
    let (n, normalize) = match normalization {
        Some(n) => (n, 1i32),
        None => (
            PixelNormalization {
                mean: [0.0; 3],
                inv_std: [1.0; 3],
            },
            0,
        ),
    };
    let func = function(device, &PIXELS, name, T::DTYPE)?;
    let mut builder = func.builder();
    builder.arg(&src).arg(&dst).arg(&pixels);
    for v in n.mean.iter().chain(&n.inv_std) {
        builder.arg(v);
    }
    builder.arg(&normalize);
    // SAFETY: the arguments match kernels/pixels.cu; the callers pass `3 × pixels` bytes at
    // `src` and `3 × pixels` elements of T at `dst`, which the kernel writes every one of.
    launched(name, unsafe {
        builder.launch(grid_stride((pixels as usize).div_ceil(4)))
    })
}

/// The pixels of contiguous u8 `storage` (three channels last) in a new buffer of `T`.
fn into_new<T: CudaDType + DeviceRepr + WithDType>(
    (storage, layout): (&CudaStorage, &Layout),
    normalization: Option<PixelNormalization>,
) -> Result<CudaStorage> {
    let device = device_of(storage);
    let stream = device.cuda_stream();
    let bytes = view::<u8>(storage, layout, "normalize_pixels")?;
    let len = layout.shape().elem_count();
    let out = output::<T>(&device, len)?;
    let addresses = (bytes.device_ptr(&stream).0, out.device_ptr(&stream).0);
    launch::<T>(&device, addresses, (len / 3) as u64, normalization)?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// The pixels of contiguous u8 `storage` (three channels last) as `dtype`.
pub(crate) fn normalize_pixels(
    input: (&CudaStorage, &Layout),
    normalization: Option<PixelNormalization>,
    dtype: DType,
) -> Result<CudaStorage> {
    match dtype {
        DType::F32 => into_new::<f32>(input, normalization),
        DType::F64 => into_new::<f64>(input, normalization),
        DType::BF16 => into_new::<bf16>(input, normalization),
        DType::F16 => into_new::<f16>(input, normalization),
        other => bail!("normalize_pixels: dtype {other:?} has no CUDA kernel"),
    }
}

/// The pixels of contiguous u8 `pixels` written into contiguous `out` (as many elements, a
/// float dtype: checked by the caller), on the device's compute stream.
pub(crate) fn normalize_pixels_into(
    pixels: &Tensor,
    normalization: Option<PixelNormalization>,
    out: &Tensor,
) -> Result<()> {
    let device = out.device().as_cuda_device()?;
    let addresses = (device_address(pixels)?, device_address(out)?);
    let count = (pixels.elem_count() / 3) as u64;
    match out.dtype() {
        DType::F32 => launch::<f32>(device, addresses, count, normalization),
        DType::F64 => launch::<f64>(device, addresses, count, normalization),
        DType::BF16 => launch::<bf16>(device, addresses, count, normalization),
        DType::F16 => launch::<f16>(device, addresses, count, normalization),
        other => bail!("normalize_pixels_into: dtype {other:?} has no CUDA kernel"),
    }
}
