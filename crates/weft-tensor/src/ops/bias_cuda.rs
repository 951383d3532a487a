//! Launches `add_bias` of `kernels/bias.cu`: columns across the threads of a block, rows across
//! the grid's second dimension.

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::cuda_launch::{device_of, function, launched, output, view, BIAS, THREADS};

fn launch<T: CudaDType + DeviceRepr + WithDType>(
    x: (&CudaStorage, &Layout),
    b: (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let name = "add_bias";
    let (rows, cols) = x.1.shape().dims2()?;
    let (Ok(rows32), Ok(cols32)) = (i32::try_from(rows), i32::try_from(cols)) else {
        bail!("{name}: {rows} x {cols} is beyond the kernel's int indices");
    };
    let device = device_of(x.0);
    let (xv, bv) = (view::<T>(x.0, x.1, name)?, view::<T>(b.0, b.1, name)?);
    let out = output::<T>(&device, rows * cols)?;
    let func = function(&device, &BIAS, name, T::DTYPE)?;
    let mut builder = func.builder();
    builder
        .arg(&xv)
        .arg(&bv)
        .arg(&out)
        .arg(&rows32)
        .arg(&cols32);
    let config = LaunchConfig {
        grid_dim: (
            (cols as u32).div_ceil(THREADS).max(1),
            rows.clamp(1, 65_535) as u32,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match kernels/bias.cu; x holds rows × cols elements and b cols
    // (checked by the op), and the kernel writes every element of the output.
    launched(name, unsafe { builder.launch(config) })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// `x + b` over the rows of contiguous CUDA `x` (`[rows, cols]`) and `b` (`[cols]`).
pub(crate) fn add_bias(
    x: (&CudaStorage, &Layout),
    b: (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    match x.0.dtype() {
        DType::F32 => launch::<f32>(x, b),
        DType::F64 => launch::<f64>(x, b),
        other => bail!("add_bias: dtype {other:?} has no CUDA kernel"),
    }
}
