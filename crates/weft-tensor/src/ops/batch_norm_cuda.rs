//! Launches the fused batch-norm kernels of `kernels/batch_norm.cu` (compiled to PTX by this
//! crate's build script) on CUDA storages: one block per channel for the reductions
//! (moments, gradient sums), a grid-stride loop for the element-wise passes.

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{CudaView, DeviceRepr, LaunchConfig, PushKernelArg};

use super::batch_norm::BnPass;

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/batch_norm.ptx"));
const MODULE: &str = "weft_batch_norm";
const THREADS: u32 = 256;

fn view<'a, T: CudaDType>(
    storage: &'a CudaStorage,
    layout: &Layout,
    name: &str,
) -> Result<CudaView<'a, T>> {
    if !layout.is_contiguous() {
        bail!("batch-norm kernel: `{name}` must be contiguous");
    }
    let start = layout.start_offset();
    Ok(storage
        .as_cuda_slice::<T>()?
        .slice(start..start + layout.shape().elem_count()))
}

/// Geometry of `x` (`N x C x H x W`).
#[derive(Clone, Copy)]
pub(crate) struct BnShape {
    pub n: usize,
    pub c: usize,
    pub plane: usize,
}

fn run<T: CudaDType + DeviceRepr + WithDType>(
    pass: BnPass,
    eps: f64,
    shape: BnShape,
    args: &[(&CudaStorage, &Layout, &'static str)],
    out_len: usize,
) -> Result<CudaStorage> {
    let device = args[0].0.device.clone();
    let suffix = match T::DTYPE {
        DType::F32 => "f32",
        _ => "f64",
    };
    let name = match pass {
        BnPass::Moments => "bn_moments",
        BnPass::Forward => "bn_forward",
        BnPass::GradSums => "bn_grad_sums",
        BnPass::GradInput => "bn_grad_input",
    };
    let func = device.get_or_load_custom_func(&format!("{name}_{suffix}"), MODULE, PTX)?;
    let views = args
        .iter()
        .map(|(storage, layout, name)| view::<T>(storage, layout, name))
        .collect::<Result<Vec<_>>>()?;
    // SAFETY: every element of the output is written by the kernel.
    let out = unsafe { device.alloc::<T>(out_len)? };
    let (n, c, hw) = (shape.n as i32, shape.c as i32, shape.plane as i32);
    let total = (shape.n * shape.c * shape.plane) as i64;
    let m = (shape.n * shape.plane) as f64;
    let reduction = LaunchConfig {
        grid_dim: (shape.c as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let elementwise = LaunchConfig {
        grid_dim: (
            (total as u64).div_ceil(THREADS as u64).min(65_535 * 8) as u32,
            1,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut builder = func.builder();
    for v in &views {
        builder.arg(v);
    }
    builder.arg(&out);
    let config = match pass {
        BnPass::Moments => {
            builder.arg(&n).arg(&c).arg(&hw);
            reduction
        }
        BnPass::GradSums => {
            builder.arg(&n).arg(&c).arg(&hw).arg(&eps);
            reduction
        }
        BnPass::Forward => {
            builder.arg(&c).arg(&hw).arg(&total).arg(&eps);
            elementwise
        }
        BnPass::GradInput => {
            builder.arg(&c).arg(&hw).arg(&total).arg(&m).arg(&eps);
            elementwise
        }
    };
    // SAFETY: the argument list matches the kernel's signature in kernels/batch_norm.cu, and
    // every pointer addresses a live allocation of the length the kernel reads or writes.
    unsafe { builder.launch(config) }
        .map_err(|e| candle_core::Error::Msg(format!("batch-norm kernel {name}: {e:?}")))?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// Runs `pass` on CUDA arguments (x first); the result has `out_len` elements.
pub(crate) fn run_cuda(
    pass: BnPass,
    eps: f64,
    shape: BnShape,
    args: &[(&CudaStorage, &Layout, &'static str)],
    out_len: usize,
) -> Result<CudaStorage> {
    match args[0].0.dtype() {
        DType::F32 => run::<f32>(pass, eps, shape, args, out_len),
        DType::F64 => run::<f64>(pass, eps, shape, args, out_len),
        other => bail!("batch-norm kernel: dtype {other:?} is not supported (f32, f64)"),
    }
}
