//! Launches the LayerNorm kernels of `kernels/layer_norm.cu`: one block of 256 threads per row.

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::cuda_launch::{device_of, function, launched, output, view, LAYER_NORM};
use super::layer_norm::Pass;

fn launch<T: CudaDType + DeviceRepr + WithDType>(
    pass: Pass,
    (rows, cols, eps): (usize, usize, f64),
    args: &[(&CudaStorage, &Layout); 3],
) -> Result<CudaStorage> {
    let name = match pass {
        Pass::Forward => "layer_norm_forward",
        Pass::Stats => "layer_norm_stats",
        Pass::BackwardInput => "layer_norm_backward_input",
    };
    let device = device_of(args[0].0);
    let views = args
        .iter()
        .map(|(storage, layout)| view::<T>(storage, layout, name))
        .collect::<Result<Vec<_>>>()?;
    let out_len = match pass {
        Pass::Stats => rows * 2,
        _ => rows * cols,
    };
    let out = output::<T>(&device, out_len)?;
    let func = function(&device, &LAYER_NORM, name, T::DTYPE)?;
    let mut builder = func.builder();
    for v in &views {
        builder.arg(v);
    }
    let c = i32::try_from(cols)
        .map_err(|_| candle_core::Error::Msg(format!("{name}: {cols} columns")))?;
    let eps = T::from_f64(eps);
    builder.arg(&out).arg(&c).arg(&eps);
    let config = LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match the kernel's signature in kernels/layer_norm.cu; the row
    // arguments hold `rows × cols` elements, the per-row statistics `2 × rows`, the weight and
    // bias `cols` (checked by the op), and the kernel writes every element of the output.
    launched(name, unsafe { builder.launch(config) })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// Runs `pass` over `rows × cols` values.
pub(crate) fn run(
    pass: Pass,
    rows: usize,
    cols: usize,
    eps: f64,
    args: &[(&CudaStorage, &Layout); 3],
) -> Result<CudaStorage> {
    match args[0].0.dtype() {
        DType::F32 => launch::<f32>(pass, (rows, cols, eps), args),
        DType::F64 => launch::<f64>(pass, (rows, cols, eps), args),
        other => bail!("layer_norm: dtype {other:?} has no CUDA kernel"),
    }
}
