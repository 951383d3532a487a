//! Launches the channels-last batch-norm kernels of `kernels/batch_norm_nhwc.cu` on the NHWC
//! storage of channels-last tensors (`rows = N*H*W` rows of `C` channels): the reductions as
//! `splits x ceil(C/32)` blocks of 32 channels x 8 rows writing double partial sums, finished
//! by batch_norm.cu's finalize kernels (with `hw = 1`); the element-wise passes as a grid-stride
//! loop with every channel's coefficients in shared memory. The graph-free passes only (table,
//! forward from a table, gradient table, input gradient).

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use half::{bf16, f16};

use super::batch_norm_cuda::{bn_views, one_thread_each};
use super::batch_norm_op::BnPass;
use super::cuda_launch::{
    device_of, function, launched, output, BATCH_NORM, BATCH_NORM_NHWC, THREADS,
};

const TILE_C: usize = 32;
const TILE_R: usize = 8;

/// Blocks along the rows of a reduction: about a thousand blocks in all, each over at least
/// a few hundred rows.
fn splits(rows: usize, c: usize) -> usize {
    (1024 / c.div_ceil(TILE_C))
        .min(rows.div_ceil(TILE_R * 32))
        .clamp(1, 65_535)
}

fn run<T, S>(
    pass: BnPass,
    (eps, relu): (f64, bool),
    (rows, c): (usize, usize),
    args: &[(&CudaStorage, &Layout, &'static str)],
    out_len: usize,
) -> Result<CudaStorage>
where
    T: CudaDType + DeviceRepr + WithDType,
    S: CudaDType + DeviceRepr + WithDType,
{
    let device = device_of(args[0].0);
    let views = bn_views::<T, S>(args)?;
    let (rows_i, c_i, total) = (rows as i64, c as i32, (rows * c) as i64);
    let m = rows as f64;
    let relu = i32::from(relu);
    // SAFETY (every launch below): the arguments match the kernels' signatures in
    // kernels/batch_norm_nhwc.cu and kernels/batch_norm.cu, and every pointer addresses a live
    // allocation of the length the kernel reads or writes (x and dy hold rows x C elements,
    // tables 4 x C or 6 x C, `partial` splits x 2C doubles each written by one block).
    match pass {
        BnPass::Table | BnPass::GradTable => {
            let splits = splits(rows, c);
            let partial = output::<f64>(&device, splits * 2 * c)?;
            let out = output::<S>(&device, out_len)?;
            let (partial_kernel, finalize_kernel) = match pass {
                BnPass::Table => ("bn_nhwc_moments_partial", "bn_table_finalize"),
                _ => ("bn_nhwc_grad_sums_partial", "bn_grad_table_finalize"),
            };
            let func = function(&device, &BATCH_NORM_NHWC, partial_kernel, T::DTYPE)?;
            let mut builder = func.builder();
            let inputs = match pass {
                BnPass::Table => &views[..1],
                _ => &views[..3],
            };
            for v in inputs {
                v.push(&mut builder);
            }
            builder.arg(&partial).arg(&rows_i).arg(&c_i);
            let config = LaunchConfig {
                grid_dim: (splits as u32, c.div_ceil(TILE_C) as u32, 1),
                block_dim: (TILE_C as u32, TILE_R as u32, 1),
                shared_mem_bytes: 0,
            };
            launched(partial_kernel, unsafe { builder.launch(config) })?;
            let func = function(&device, &BATCH_NORM, finalize_kernel, T::DTYPE)?;
            let mut builder = func.builder();
            let (one, splits_i) = (1i32, splits as i32);
            match pass {
                BnPass::Table => {
                    views[0].push(&mut builder);
                    builder.arg(&partial);
                    views[1].push(&mut builder);
                    views[2].push(&mut builder);
                    builder.arg(&out).arg(&c_i).arg(&one).arg(&splits_i).arg(&m);
                }
                _ => {
                    views[2].push(&mut builder);
                    builder
                        .arg(&partial)
                        .arg(&out)
                        .arg(&c_i)
                        .arg(&splits_i)
                        .arg(&eps);
                }
            }
            launched(finalize_kernel, unsafe {
                builder.launch(one_thread_each(c))
            })?;
            Ok(CudaStorage::wrap_cuda_slice(out, device))
        }
        BnPass::ForwardTable | BnPass::GradInput => {
            let out = output::<T>(&device, out_len)?;
            let (kernel, coefficients) = match pass {
                BnPass::ForwardTable => ("bn_nhwc_forward", 2),
                _ => ("bn_nhwc_grad_input", 3),
            };
            let func = function(&device, &BATCH_NORM_NHWC, kernel, T::DTYPE)?;
            let mut builder = func.builder();
            for v in &views {
                v.push(&mut builder);
            }
            builder.arg(&out).arg(&total).arg(&c_i);
            match pass {
                BnPass::ForwardTable => builder.arg(&eps).arg(&relu),
                _ => builder.arg(&m).arg(&eps),
            };
            let config = LaunchConfig {
                grid_dim: (
                    (total as u64).div_ceil(THREADS as u64).clamp(1, 1024) as u32,
                    1,
                    1,
                ),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: (coefficients * c * std::mem::size_of::<S>()) as u32,
            };
            launched(kernel, unsafe { builder.launch(config) })?;
            Ok(CudaStorage::wrap_cuda_slice(out, device))
        }
        other => bail!("channels-last batch norm: pass {other:?} is not written for NHWC"),
    }
}

/// Runs `pass` on the NHWC storages of channels-last arguments (x first); the result has
/// `out_len` elements.
pub(crate) fn run_cuda_nhwc(
    pass: BnPass,
    (eps, relu): (f64, bool),
    (rows, c): (usize, usize),
    args: &[(&CudaStorage, &Layout, &'static str)],
    out_len: usize,
) -> Result<CudaStorage> {
    if rows * c > i64::MAX as usize || c > 2048 {
        bail!("channels-last batch norm: {rows} rows of {c} channels are beyond the kernels (at most 2048 channels)");
    }
    let settings = (eps, relu);
    match args[0].0.dtype() {
        DType::F32 => run::<f32, f32>(pass, settings, (rows, c), args, out_len),
        DType::F64 => run::<f64, f64>(pass, settings, (rows, c), args, out_len),
        DType::BF16 => run::<bf16, f32>(pass, settings, (rows, c), args, out_len),
        DType::F16 => run::<f16, f32>(pass, settings, (rows, c), args, out_len),
        other => bail!("channels-last batch norm: dtype {other:?} is not supported"),
    }
}
