//! Launches the channels-last batch-norm kernels of `kernels/batch_norm_nhwc.cu` on the NHWC
//! storage of channels-last tensors (`rows = N*H*W` rows of `C` channels). A thread owns one
//! vector of four channels (two of f64) when `C` allows (one channel otherwise): the reductions
//! run as splits of blocks of up to 32 such columns by rows, writing double partial sums
//! finished by batch_norm.cu's finalize kernels (with `hw = 1`, a group of threads per channel);
//! the element-wise passes as blocks of columns by rows. All but the plain forward stream their
//! rows through shared memory (`lanes_of`). The graph-free passes only (table,
//! forward from a table, gradient table, input gradient), the backward ones with the ReLU's mask
//! when `relu`.

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use half::{bf16, f16};

use super::batch_norm_cuda::{bn_views, finalize_groups};
use super::batch_norm_op::BnPass;
use super::cuda_launch::{
    device_of, function, launched, output, BATCH_NORM, BATCH_NORM_NHWC, THREADS,
};
use super::running_update::RunningTarget;

/// Vectors of channels a reduction block spans (at most).
const REDUCTION_COLUMNS: usize = 32;

/// A reduction's grid over `columns` vectors of `lanes` channels and `rows` rows: blocks of up
/// to 32 columns by as many rows as fill them, about a thousand blocks in all along the rows
/// (the splits), each thread over at least 16 rows; shared memory for each thread's 2 x lanes
/// double sums.
fn reduction_grid(columns: usize, lanes: usize, rows: usize) -> (usize, LaunchConfig) {
    let across = columns.min(REDUCTION_COLUMNS);
    let down = (THREADS as usize / across).max(1);
    let column_blocks = columns.div_ceil(across);
    let splits = (1024 / column_blocks)
        .min(rows.div_ceil(down * 16))
        .clamp(1, 65_535);
    let config = LaunchConfig {
        grid_dim: (splits as u32, column_blocks as u32, 1),
        block_dim: (across as u32, down as u32, 1),
        shared_mem_bytes: (across * down * 2 * lanes * std::mem::size_of::<f64>()) as u32,
    };
    (splits, config)
}

/// The vector width of `pass` over `c` channels of `T` (kernels/batch_norm_nhwc.cu's
/// `BnLanes`: four channels, two of f64, when `c` is a multiple) and the kernels' name suffix
/// for it: `_vecs` for the passes whose rows stream through shared memory
/// (`kernels/row_stream.cuh`), every pass but the plain forward, whose `_vec` kernel was faster.
fn lanes_of<T>(c: usize, pass: BnPass) -> (usize, &'static str) {
    let lanes = match std::mem::size_of::<T>() {
        8 => 2,
        _ => 4,
    };
    let streamed = !matches!(pass, BnPass::ForwardTable);
    match (c % lanes, streamed) {
        (0, true) => (lanes, "_vecs"),
        (0, false) => (lanes, "_vec"),
        _ => (1, ""),
    }
}

/// A `Table` pass updates `running` (when it has addresses).
fn run<T, S>(
    pass: BnPass,
    (eps, relu): (f64, bool),
    (rows, c): (usize, usize),
    args: &[(&CudaStorage, &Layout, &'static str)],
    out_len: usize,
    running: RunningTarget,
) -> Result<CudaStorage>
where
    T: CudaDType + DeviceRepr + WithDType,
    S: CudaDType + DeviceRepr + WithDType,
{
    let device = device_of(args[0].0);
    let views = bn_views::<T, S>(args)?;
    let (rows_i, c_i) = (rows as i64, c as i32);
    let m = rows as f64;
    let relu = i32::from(relu);
    // SAFETY (every launch below): the arguments match the kernels' signatures in
    // kernels/batch_norm_nhwc.cu and kernels/batch_norm.cu, and every pointer addresses a live
    // allocation of the length the kernel reads or writes (x and dy hold rows x C elements,
    // tables 4 x C or 6 x C, `partial` splits x 2C doubles each written by one block).
    match pass {
        BnPass::Table | BnPass::GradTable => {
            let (lanes, vec) = lanes_of::<T>(c, pass);
            let (splits, config) = reduction_grid(c / lanes, lanes, rows);
            let partial = output::<f64>(&device, splits * 2 * c)?;
            let out = output::<S>(&device, out_len)?;
            let (partial_kernel, finalize_kernel) = match pass {
                BnPass::Table => (format!("bn_nhwc_moments_partial{vec}"), "bn_table_finalize"),
                _ => (
                    format!("bn_nhwc_grad_sums_partial{vec}"),
                    "bn_grad_table_finalize",
                ),
            };
            let func = function(&device, &BATCH_NORM_NHWC, &partial_kernel, T::DTYPE)?;
            if vec == "_vecs" {
                func.prefer_shared_memory()?;
            }
            let mut builder = func.builder();
            let inputs = match pass {
                BnPass::Table => &views[..1],
                _ => &views[..3],
            };
            for v in inputs {
                v.push(&mut builder);
            }
            builder.arg(&partial).arg(&rows_i).arg(&c_i);
            if let BnPass::GradTable = pass {
                builder.arg(&eps).arg(&relu);
            }
            launched(&partial_kernel, unsafe { builder.launch(config) })?;
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
                    running.push(&mut builder);
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
                builder.launch(finalize_groups(c, splits))
            })?;
            Ok(CudaStorage::wrap_cuda_slice(out, device))
        }
        BnPass::ForwardTable | BnPass::GradInput | BnPass::ForwardTableAddRelu => {
            let out = output::<T>(&device, out_len)?;
            // A thread owns a vector of a row's channels when they divide into such vectors.
            let (lanes, vec) = lanes_of::<T>(c, pass);
            let kernel = match pass {
                BnPass::ForwardTable => format!("bn_nhwc_forward{vec}"),
                BnPass::ForwardTableAddRelu => format!("bn_nhwc_forward_add_relu{vec}"),
                _ => format!("bn_nhwc_grad_input{vec}"),
            };
            let func = function(&device, &BATCH_NORM_NHWC, &kernel, T::DTYPE)?;
            if vec == "_vecs" {
                func.prefer_shared_memory()?;
            }
            let mut builder = func.builder();
            for v in &views {
                v.push(&mut builder);
            }
            let rows_u = rows as u32;
            builder.arg(&out).arg(&rows_u).arg(&c_i);
            match pass {
                BnPass::ForwardTable => builder.arg(&eps).arg(&relu),
                BnPass::ForwardTableAddRelu => builder.arg(&eps),
                _ => builder.arg(&m).arg(&eps).arg(&relu),
            };
            let config = match pass {
                BnPass::GradInput => columns_by_rows(c / lanes, rows, input_gradient_rows),
                _ => columns_by_rows(c / lanes, rows, |_, _| 4),
            };
            launched(&kernel, unsafe { builder.launch(config) })?;
            Ok(CudaStorage::wrap_cuda_slice(out, device))
        }
        other => bail!("channels-last batch norm: pass {other:?} is not written for NHWC"),
    }
}

/// Rows each thread of the input gradient takes when a block spans `down` rows: as many as
/// leave about a thousand blocks, from 4 to 16. With four rows each (the forward passes' share)
/// the bf16 pass ran at 70 % of the memory's bandwidth where the f32 one ran at over 90 %; 16
/// rows took it from 3.89 to 3.37 ms a ResNet-50 step (batch 128, H100). Not through its
/// prologue (seven coefficients per channel in double): computed once per block column into
/// shared memory instead, they gained nothing (docs/history/2026-11.md, seventeenth session).
fn input_gradient_rows(rows: usize, down: usize) -> usize {
    (rows / (down * 1024)).clamp(4, 16)
}

/// The element-wise passes' grid: `columns` threads across a row (blocks of at most
/// `THREADS`), as many rows per block as fill it, and each thread taking `per_thread(rows,
/// down)` rows.
fn columns_by_rows(
    columns: usize,
    rows: usize,
    per_thread: impl Fn(usize, usize) -> usize,
) -> LaunchConfig {
    let across = columns.min(THREADS as usize);
    let down = (THREADS as usize / across).max(1);
    let per_thread = per_thread(rows, down);
    LaunchConfig {
        grid_dim: (
            columns.div_ceil(across) as u32,
            rows.div_ceil(down * per_thread).clamp(1, 65_535) as u32,
            1,
        ),
        block_dim: (across as u32, down as u32, 1),
        shared_mem_bytes: 0,
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
    running: RunningTarget,
) -> Result<CudaStorage> {
    if rows > u32::MAX as usize || rows * c > i64::MAX as usize || c > 2048 {
        bail!("channels-last batch norm: {rows} rows of {c} channels are beyond the kernels (at most 2^32 rows, 2048 channels)");
    }
    let settings = (eps, relu);
    match args[0].0.dtype() {
        DType::F32 => run::<f32, f32>(pass, settings, (rows, c), args, out_len, running),
        DType::F64 => run::<f64, f64>(pass, settings, (rows, c), args, out_len, running),
        DType::BF16 => run::<bf16, f32>(pass, settings, (rows, c), args, out_len, running),
        DType::F16 => run::<f16, f32>(pass, settings, (rows, c), args, out_len, running),
        other => bail!("channels-last batch norm: dtype {other:?} is not supported"),
    }
}
