//! Launches the ReLU kernels of `kernels/relu.cu` on CUDA storages (grid-stride loops over the
//! contiguous elements in 16-byte vectors).

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, Shape, WithDType};
use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::cuda_launch::{device_of, function, grid_stride, launched, output, view, RELU};
use super::relu::ReluOp;

fn launch<T: CudaDType + DeviceRepr + WithDType>(
    op: ReluOp,
    args: &[(&CudaStorage, &Layout)],
) -> Result<CudaStorage> {
    let device = device_of(args[0].0);
    let len = args[0].1.shape().elem_count();
    let views = args
        .iter()
        .map(|(storage, layout)| view::<T>(storage, layout, op.kernel_name()))
        .collect::<Result<Vec<_>>>()?;
    let out = output::<T>(&device, len)?;
    let func = function(&device, &RELU, op.kernel_name(), T::DTYPE)?;
    let mut builder = func.builder();
    for v in &views {
        builder.arg(v);
    }
    let n = len as i64;
    builder.arg(&out).arg(&n);
    // A thread per 16-byte vector (the kernels' grid-stride loops take any grid).
    let vectors = len.div_ceil(16 / std::mem::size_of::<T>());
    // SAFETY: the arguments match the kernel's signature in kernels/relu.cu; every input
    // holds `len` elements (same shapes, checked by the caller) and the output is `len` long.
    launched(op.kernel_name(), unsafe {
        builder.launch(grid_stride(vectors))
    })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// Runs `op` on its CUDA arguments (one for the forward ReLU, two otherwise, same shapes).
pub(crate) fn run(op: ReluOp, args: &[(&CudaStorage, &Layout)]) -> Result<(CudaStorage, Shape)> {
    let shape = args[0].1.shape().clone();
    let storage = match args[0].0.dtype() {
        DType::F32 => launch::<f32>(op, args)?,
        DType::F64 => launch::<f64>(op, args)?,
        DType::BF16 => launch::<half::bf16>(op, args)?,
        DType::F16 => launch::<half::f16>(op, args)?,
        other => bail!("{}: dtype {other:?} is not supported", op.kernel_name()),
    };
    Ok((storage, shape))
}
