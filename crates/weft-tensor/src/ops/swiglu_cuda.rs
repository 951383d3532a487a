//! Launches the SwiGLU kernels of `kernels/swiglu.cu` over contiguous elements of one type
//! (f32, bf16, f16), a thread per 16-byte vector: the forward `silu(gate) · up`, and the
//! backward writing `[d_gate | d_up]` into one buffer of twice the length.

use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{DeviceRepr, PushKernelArg};
use half::{bf16, f16};

use super::cuda_launch::{device_of, function, grid_stride, launched, output, view, SWIGLU};

/// Runs `name` over `inputs` (each of the first one's length) into a new output of `outputs`
/// times that length.
fn launch<T: CudaDType + DeviceRepr + WithDType>(
    name: &str,
    inputs: &[(&CudaStorage, &Layout)],
    outputs: usize,
) -> Result<CudaStorage> {
    let len = inputs[0].1.shape().elem_count();
    if inputs.iter().any(|(_, l)| l.shape().elem_count() != len) {
        bail!("{name}: inputs of different lengths");
    }
    let device = device_of(inputs[0].0);
    let views = inputs
        .iter()
        .map(|(storage, layout)| view::<T>(storage, layout, name))
        .collect::<Result<Vec<_>>>()?;
    let out = output::<T>(&device, outputs * len)?;
    let func = function(&device, &SWIGLU, name, T::DTYPE)?;
    let n = len as i64;
    let mut builder = func.builder();
    for v in &views {
        builder.arg(v);
    }
    builder.arg(&out).arg(&n);
    // A thread per 16-byte vector (the kernels' grid-stride loops take any grid).
    let per_thread = 16 / std::mem::size_of::<T>();
    // SAFETY: the arguments match the kernel's signature in kernels/swiglu.cu; every input
    // holds `len` elements (checked above) and the kernel writes all `outputs × len` of the
    // output.
    launched(name, unsafe {
        builder.launch(grid_stride(len.div_ceil(per_thread)))
    })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

fn dispatch(name: &str, inputs: &[(&CudaStorage, &Layout)], outputs: usize) -> Result<CudaStorage> {
    use candle_core::backend::BackendStorage;
    match inputs[0].0.dtype() {
        DType::F32 => launch::<f32>(name, inputs, outputs),
        DType::BF16 => launch::<bf16>(name, inputs, outputs),
        DType::F16 => launch::<f16>(name, inputs, outputs),
        other => bail!("{name}: dtype {other:?} has no CUDA kernel"),
    }
}

/// `silu(gate) · up`.
pub(crate) fn forward(
    gate: (&CudaStorage, &Layout),
    up: (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    dispatch("swiglu_forward", &[gate, up], 1)
}

/// `[d_gate | d_up]` from `dy`.
pub(crate) fn backward(
    gate: (&CudaStorage, &Layout),
    up: (&CudaStorage, &Layout),
    dy: (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    dispatch("swiglu_backward", &[gate, up, dy], 2)
}
