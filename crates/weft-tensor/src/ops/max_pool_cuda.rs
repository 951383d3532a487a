//! Launches the max-pool kernels of `kernels/max_pool.cu` on CUDA storages over NCHW planes:
//! the forward pass one thread per output, the backward pass one thread per input (no atomics).
//! The channels-last kernels are launched by `max_pool_nhwc_cuda`.

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::cuda_launch::{device_of, function, grid_stride, launched, output, view, MAX_POOL};
use super::max_pool_cpu::{PoolPlanes, PoolWindow};

/// `struct Geometry` of kernels/max_pool_window.cuh.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct Geometry {
    h: i32,
    w: i32,
    oh: i32,
    ow: i32,
    kernel: i32,
    stride: i32,
    padding: i32,
}

// SAFETY: a plain `repr(C)` struct of integers, laid out as the kernel's `Geometry`.
unsafe impl DeviceRepr for Geometry {}

pub(super) fn geometry(window: PoolWindow, planes: PoolPlanes) -> Result<Geometry> {
    let int = |v: usize| {
        i32::try_from(v).map_err(|_| {
            candle_core::Error::Msg(format!(
                "max_pool2d: size {v} is too large for the CUDA kernel"
            ))
        })
    };
    Ok(Geometry {
        h: int(planes.input.0)?,
        w: int(planes.input.1)?,
        oh: int(planes.output.0)?,
        ow: int(planes.output.1)?,
        kernel: int(window.kernel)?,
        stride: int(window.stride)?,
        padding: int(window.padding)?,
    })
}

fn launch<T: CudaDType + DeviceRepr + WithDType>(
    window: PoolWindow,
    planes: PoolPlanes,
    args: &[(&CudaStorage, &Layout, &'static str)],
) -> Result<CudaStorage> {
    let backward = args.len() == 3;
    let kernel = if backward {
        "max_pool_backward"
    } else {
        "max_pool_forward"
    };
    let device = device_of(args[0].0);
    let views = args
        .iter()
        .map(|(storage, layout, name)| view::<T>(storage, layout, name))
        .collect::<Result<Vec<_>>>()?;
    let per_plane = if backward {
        planes.input.0 * planes.input.1
    } else {
        planes.output.0 * planes.output.1
    };
    let total = planes.count * per_plane;
    let out = output::<T>(&device, total)?;
    let geometry = geometry(window, planes)?;
    let total_arg = total as i64;
    let func = function(&device, &MAX_POOL, kernel, T::DTYPE)?;
    let mut builder = func.builder();
    for v in &views {
        builder.arg(v);
    }
    builder.arg(&out).arg(&total_arg).arg(&geometry);
    // SAFETY: the arguments match the kernel's signature in kernels/max_pool.cu; `x` (and `dx`)
    // hold `count` input planes, `y` and `dy` (and the forward output) `count` output planes,
    // as checked by the caller's shape validation.
    launched(kernel, unsafe { builder.launch(grid_stride(total)) })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// Forward pass (`args = [x]`) or backward pass (`args = [x, y, dy]`, returns `dx`).
pub(crate) fn run(
    window: PoolWindow,
    planes: PoolPlanes,
    args: &[(&CudaStorage, &Layout, &'static str)],
) -> Result<CudaStorage> {
    match args[0].0.dtype() {
        DType::F32 => launch::<f32>(window, planes, args),
        DType::F64 => launch::<f64>(window, planes, args),
        DType::BF16 => launch::<half::bf16>(window, planes, args),
        DType::F16 => launch::<half::f16>(window, planes, args),
        other => bail!("max_pool2d: dtype {other:?} is not supported on CUDA"),
    }
}
