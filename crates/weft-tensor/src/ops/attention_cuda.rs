//! Launches the fused attention kernels of `kernels/attention.cu`: one block per 32 rows of a
//! (batch, head) plane, [`lanes`] threads per row, the kernel chosen by pass, dtype and head
//! width.

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::attention_cpu::{AttentionPass, AttentionShape};
use super::cuda_launch::{device_of, function_named, launched, output, view, ATTENTION};

/// Rows per block: `TILE` of the kernels.
const TILE: usize = 32;

/// Threads per row for head width `width` (the kernels' `L`): 1 below width 8, 2 from 8 to 32,
/// 4 at 64 (measured on an H100 for GPT-2's d64: 4 lanes 1.6 % faster than 2).
fn lanes(width: usize) -> usize {
    match width {
        64.. => 4,
        8.. => 2,
        _ => 1,
    }
}

fn launch<T: CudaDType + DeviceRepr + WithDType>(
    pass: AttentionPass,
    shape: AttentionShape,
    args: &[(&CudaStorage, &Layout); 3],
    out_len: usize,
    suffix: &str,
) -> Result<CudaStorage> {
    let name = match pass {
        AttentionPass::Forward => "attention_forward",
        AttentionPass::KeyValueGrads => "attention_backward_kv",
        AttentionPass::QueryGrads => "attention_backward_q",
    };
    let lanes = lanes(shape.width);
    let kernel = format!("{name}_{suffix}_d{}", shape.width);
    let device = device_of(args[0].0);
    let views = args
        .iter()
        .map(|(storage, layout)| view::<T>(storage, layout, name))
        .collect::<Result<Vec<_>>>()?;
    let out = output::<T>(&device, out_len)?;
    let func = function_named(&device, &ATTENTION, &kernel)?;
    let mut builder = func.builder();
    for v in &views {
        builder.arg(v);
    }
    let seq = i32::try_from(shape.seq).map_err(|_| {
        candle_core::Error::Msg(format!("{name}: sequence of {} tokens", shape.seq))
    })?;
    let scale = T::from_f64(shape.scale);
    builder.arg(&out).arg(&seq).arg(&scale);
    let config = LaunchConfig {
        grid_dim: (shape.seq.div_ceil(TILE) as u32, shape.planes as u32, 1),
        block_dim: ((TILE * lanes) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match the kernel's signature in kernels/attention.cu; the inputs
    // hold `planes × seq` rows of the widths the pass reads (checked by the op's shapes) and
    // the output `out_len` elements, every one of which the kernel writes.
    launched(&kernel, unsafe { builder.launch(config) })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// Runs `pass` on its three contiguous CUDA arguments into a fresh output of `out_len`.
pub(crate) fn run(
    pass: AttentionPass,
    shape: AttentionShape,
    args: &[(&CudaStorage, &Layout); 3],
    out_len: usize,
) -> Result<CudaStorage> {
    if !super::attention::has_cuda_attention(args[0].0.dtype(), shape.width) {
        bail!(
            "attention: no CUDA kernel for head width {} in {:?}",
            shape.width,
            args[0].0.dtype()
        );
    }
    match args[0].0.dtype() {
        DType::F32 => launch::<f32>(pass, shape, args, out_len, "f32"),
        DType::F64 => launch::<f64>(pass, shape, args, out_len, "f64"),
        other => bail!("attention: dtype {other:?} has no CUDA kernel"),
    }
}
