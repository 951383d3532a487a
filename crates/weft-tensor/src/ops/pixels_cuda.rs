//! Launches `normalize_pixels` of `kernels/pixels.cu`: a grid-stride loop, a thread per pixel.

use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{DeviceRepr, PushKernelArg};
use half::{bf16, f16};

use super::cuda_launch::{device_of, function, grid_stride, launched, output, view, PIXELS};
use super::pixels::PixelNormalization;

fn launch<T: CudaDType + DeviceRepr + WithDType>(
    (storage, layout): (&CudaStorage, &Layout),
    normalization: Option<PixelNormalization>,
) -> Result<CudaStorage> {
    let name = "normalize_pixels";
    let device = device_of(storage);
    let bytes = view::<u8>(storage, layout, name)?;
    let len = layout.shape().elem_count();
    let pixels = (len / 3) as u64;
    let out = output::<T>(&device, len)?;
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
    let func = function(&device, &PIXELS, name, T::DTYPE)?;
    let mut builder = func.builder();
    builder.arg(&bytes).arg(&out).arg(&pixels);
    for v in n.mean.iter().chain(&n.inv_std) {
        builder.arg(v);
    }
    builder.arg(&normalize);
    // SAFETY: the arguments match kernels/pixels.cu; `bytes` holds 3 x `pixels` bytes (the op
    // checked the last axis) and the kernel writes every element of the output.
    launched(name, unsafe {
        builder.launch(grid_stride(pixels as usize))
    })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// The pixels of contiguous u8 `storage` (three channels last) as `dtype`.
pub(crate) fn normalize_pixels(
    input: (&CudaStorage, &Layout),
    normalization: Option<PixelNormalization>,
    dtype: DType,
) -> Result<CudaStorage> {
    match dtype {
        DType::F32 => launch::<f32>(input, normalization),
        DType::F64 => launch::<f64>(input, normalization),
        DType::BF16 => launch::<bf16>(input, normalization),
        DType::F16 => launch::<f16>(input, normalization),
        other => bail!("normalize_pixels: dtype {other:?} has no CUDA kernel"),
    }
}
