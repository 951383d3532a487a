//! Launches `gelu_tanh_backward` of `kernels/gelu.cu`, grid-stride over contiguous elements.

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::cuda_launch::{device_of, function, grid_stride, launched, output, view, GELU};

fn launch<T: CudaDType + DeviceRepr + WithDType>(
    x: (&CudaStorage, &Layout),
    dy: (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let name = "gelu_tanh_backward";
    let device = device_of(x.0);
    let len = x.1.shape().elem_count();
    let (xv, dyv) = (view::<T>(x.0, x.1, name)?, view::<T>(dy.0, dy.1, name)?);
    let out = output::<T>(&device, len)?;
    let func = function(&device, &GELU, name, T::DTYPE)?;
    let n = len as i64;
    let mut builder = func.builder();
    builder.arg(&xv).arg(&dyv).arg(&out).arg(&n);
    // SAFETY: the arguments match kernels/gelu.cu; both inputs hold `len` elements (same
    // shapes, checked by the op) and the kernel writes all `len` of the output.
    launched(name, unsafe { builder.launch(grid_stride(len)) })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// `dy · gelu'(x)` for contiguous CUDA `x` and `dy` of one shape.
pub(crate) fn backward(
    x: (&CudaStorage, &Layout),
    dy: (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    match x.0.dtype() {
        DType::F32 => launch::<f32>(x, dy),
        DType::F64 => launch::<f64>(x, dy),
        other => bail!("gelu_tanh_backward: dtype {other:?} has no CUDA kernel"),
    }
}
