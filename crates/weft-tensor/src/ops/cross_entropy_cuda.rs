//! Launches the cross-entropy kernels of `kernels/cross_entropy.cu`: the forward with one block
//! of 256 threads per row, the backward grid-stride over the logits' elements.

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::cross_entropy::Pass;
use super::cuda_launch::{device_of, function, grid_stride, launched, output, view, CROSS_ENTROPY};

fn launch<T: CudaDType + DeviceRepr + WithDType>(
    pass: Pass,
    (rows, cols, classes): (usize, usize, usize),
    args: &[(&CudaStorage, &Layout); 3],
) -> Result<CudaStorage> {
    let name = match pass {
        Pass::Forward => "cross_entropy_forward",
        Pass::Backward => "cross_entropy_backward",
    };
    let device = device_of(args[0].0);
    let views = args
        .iter()
        .map(|(storage, layout)| view::<T>(storage, layout, name))
        .collect::<Result<Vec<_>>>()?;
    let out_len = match pass {
        Pass::Forward => rows * 2,
        Pass::Backward => rows * cols,
    };
    let out = output::<T>(&device, out_len)?;
    let func = function(&device, &CROSS_ENTROPY, name, T::DTYPE)?;
    let mut builder = func.builder();
    for v in &views {
        builder.arg(v);
    }
    let to_i32 = |v: usize| {
        i32::try_from(v).map_err(|_| candle_core::Error::Msg(format!("{name}: {v} columns")))
    };
    let (n, c, k) = (rows as i64, to_i32(cols)?, to_i32(classes)?);
    builder.arg(&out).arg(&n).arg(&c).arg(&k);
    let config = match pass {
        Pass::Forward => LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        },
        Pass::Backward => grid_stride(out_len),
    };
    // SAFETY: the arguments match the kernel's signature in kernels/cross_entropy.cu; the
    // logits hold `rows × cols` elements, the targets `rows`, the statistics `2 × rows`
    // (checked by the op), and the kernel writes every element of the output.
    launched(name, unsafe { builder.launch(config) })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// Runs `pass` over `rows × cols` logits, `classes` of whose columns count.
pub(crate) fn run(
    pass: Pass,
    rows: usize,
    cols: usize,
    classes: usize,
    args: &[(&CudaStorage, &Layout); 3],
) -> Result<CudaStorage> {
    let shape = (rows, cols, classes);
    match args[0].0.dtype() {
        DType::F32 => launch::<f32>(pass, shape, args),
        DType::F64 => launch::<f64>(pass, shape, args),
        other => bail!("cross_entropy_rows: dtype {other:?} has no CUDA kernel"),
    }
}
