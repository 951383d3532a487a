//! Launches the tanh GELU kernels of `kernels/gelu.cu` over contiguous elements: the backward
//! for f32/f64 (grid-stride over elements), the forward and the backward for bf16/f16
//! (grid-stride over 16-byte vectors of 8 values, f32 inside).

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{DeviceRepr, PushKernelArg};
use half::{bf16, f16};

use super::cuda_launch::{device_of, function, grid_stride, launched, output, view, GELU};

/// Runs `name` over the contiguous inputs (`x`, then `dy` for the backward), all of x's
/// length and element type `T`, into a new output of that length.
fn launch<T: CudaDType + DeviceRepr + WithDType>(
    name: &str,
    inputs: &[(&CudaStorage, &Layout)],
) -> Result<CudaStorage> {
    let (x, layout) = inputs[0];
    let device = device_of(x);
    let len = layout.shape().elem_count();
    let views = inputs
        .iter()
        .map(|(storage, layout)| view::<T>(storage, layout, name))
        .collect::<Result<Vec<_>>>()?;
    let out = output::<T>(&device, len)?;
    let func = function(&device, &GELU, name, T::DTYPE)?;
    let n = len as i64;
    let mut builder = func.builder();
    for v in &views {
        builder.arg(v);
    }
    builder.arg(&out).arg(&n);
    // A thread per element, or per 16-byte vector of 16-bit values (the kernels' grid-stride
    // loops take any grid).
    let per_thread = match T::DTYPE {
        DType::BF16 | DType::F16 => 8,
        _ => 1,
    };
    // SAFETY: the arguments match the kernel's signature in kernels/gelu.cu; every input holds
    // `len` elements (x and dy of one shape, checked by `gelu_tanh_backward`) and the kernel
    // writes all `len` of the output.
    launched(name, unsafe {
        builder.launch(grid_stride(len.div_ceil(per_thread)))
    })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// `gelu_tanh(x)` for a contiguous bf16 or f16 CUDA `x`.
pub(crate) fn forward(x: (&CudaStorage, &Layout)) -> Result<CudaStorage> {
    let name = "gelu_tanh_forward";
    match x.0.dtype() {
        DType::BF16 => launch::<bf16>(name, &[x]),
        DType::F16 => launch::<f16>(name, &[x]),
        other => bail!("{name}: dtype {other:?} has no weft CUDA kernel"),
    }
}

/// `dy · gelu'(x)` for contiguous CUDA `x` and `dy` of one shape.
pub(crate) fn backward(
    x: (&CudaStorage, &Layout),
    dy: (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let name = "gelu_tanh_backward";
    match x.0.dtype() {
        DType::F32 => launch::<f32>(name, &[x, dy]),
        DType::F64 => launch::<f64>(name, &[x, dy]),
        DType::BF16 => launch::<bf16>(name, &[x, dy]),
        DType::F16 => launch::<f16>(name, &[x, dy]),
        other => bail!("{name}: dtype {other:?} has no CUDA kernel"),
    }
}
