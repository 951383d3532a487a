//! Launches `add_bias` of `kernels/bias.cu`: columns across the threads of a block, rows across
//! the grid's second dimension (f32/f64: a thread per column; bf16/f16: a thread per unit of 8
//! columns when `cols` is a multiple of 8, per column otherwise, and as many rows across a
//! block's second dimension as fill 256 threads).

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use half::{bf16, f16};

use super::cuda_launch::{device_of, function, launched, output, view, BIAS, THREADS};

/// The blocks and grid over `rows × cols` of element type `dtype`, as kernels/bias.cu's
/// kernels of that type map their threads.
pub(crate) fn geometry(dtype: DType, rows: usize, cols: usize) -> LaunchConfig {
    let (units, threads) = match dtype {
        DType::BF16 | DType::F16 => {
            let units = if cols.is_multiple_of(8) {
                cols / 8
            } else {
                cols
            };
            (
                units,
                units.next_multiple_of(32).clamp(32, THREADS as usize) as u32,
            )
        }
        _ => (cols, THREADS),
    };
    let rows_per_block = THREADS / threads;
    LaunchConfig {
        grid_dim: (
            (units as u32).div_ceil(threads).max(1),
            rows.div_ceil(rows_per_block as usize).clamp(1, 65_535) as u32,
            1,
        ),
        block_dim: (threads, rows_per_block, 1),
        shared_mem_bytes: 0,
    }
}

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
    // SAFETY: the arguments match kernels/bias.cu; x holds rows × cols elements and b cols
    // (checked by the op), and the kernel writes every element of the output (the geometry
    // is the one the kernel of this type expects: its threads cover every unit of columns,
    // and its rows stride over all rows).
    launched(name, unsafe {
        builder.launch(geometry(T::DTYPE, rows, cols))
    })?;
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
        DType::BF16 => launch::<bf16>(x, b),
        DType::F16 => launch::<f16>(x, b),
        other => bail!("add_bias: dtype {other:?} has no CUDA kernel"),
    }
}
