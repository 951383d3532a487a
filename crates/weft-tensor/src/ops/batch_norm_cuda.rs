//! Launches the fused batch-norm kernels of `kernels/batch_norm.cu` on CUDA storages: the
//! reductions (moments, gradient sums) as `splits x C` blocks writing double partial sums plus
//! a finalize kernel, the element-wise passes as one row of blocks per `H x W` plane. 16-bit
//! data has f32 statistics and tables.

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{CudaView, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg};
use half::{bf16, f16};

use super::batch_norm_op::BnPass;
use super::cuda_launch::{device_of, function, launched, output, view, BATCH_NORM, THREADS};
use super::running_update::RunningTarget;

/// Geometry of `x` (`N x C x H x W`).
#[derive(Clone, Copy)]
pub(crate) struct BnShape {
    pub n: usize,
    pub c: usize,
    pub plane: usize,
}

impl BnShape {
    /// Blocks per channel of a reduction: enough blocks in all to fill the GPU several times
    /// over, each with at least a few thousand elements.
    fn splits(&self) -> u32 {
        const TARGET_BLOCKS: usize = 1024;
        const MIN_PER_BLOCK: usize = 4096;
        let per_channel = self.n * self.plane;
        TARGET_BLOCKS
            .div_ceil(self.c)
            .min(per_channel.div_ceil(MIN_PER_BLOCK))
            .max(1) as u32
    }

    fn reduction(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.splits(), self.c as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    fn finalize(&self) -> LaunchConfig {
        finalize_groups(self.c, self.splits() as usize)
    }

    /// One row of blocks per plane, each thread taking about four elements.
    fn planes(&self) -> LaunchConfig {
        let threads = (self.plane.next_multiple_of(32) as u32).min(THREADS);
        let chunks = self.plane.div_ceil(threads as usize * 4).clamp(1, 65_535) as u32;
        LaunchConfig {
            grid_dim: ((self.n * self.c) as u32, chunks, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// The finalize kernels' grid over `c` channels of `splits` partial sums each: a group of
/// threads per channel (`blockDim.x`), a multiple of 32 with about one thread per split up to
/// 256, and as many channels to a block (`blockDim.y`) as fill 256 threads.
pub(super) fn finalize_groups(c: usize, splits: usize) -> LaunchConfig {
    let group = splits.next_multiple_of(32).clamp(32, THREADS as usize);
    let channels = THREADS as usize / group;
    LaunchConfig {
        grid_dim: (c.div_ceil(channels) as u32, 1, 1),
        block_dim: (group as u32, channels as u32, 1),
        shared_mem_bytes: 0,
    }
}

/// One thread for each of `n` items (a running statistic).
pub(crate) fn one_thread_each(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u32).div_ceil(THREADS), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A typed view of one argument: data (`x`, `dy`, the affine parameters) of element type `T`,
/// or statistics (a table, `[mean; var]`) of type `S`.
pub(super) enum BnView<'a, T, S> {
    Data(CudaView<'a, T>),
    Stat(CudaView<'a, S>),
}

impl<T: DeviceRepr, S: DeviceRepr> BnView<'_, T, S> {
    pub(super) fn push<'b>(&'b self, builder: &mut LaunchArgs<'b>) {
        match self {
            BnView::Data(v) => builder.arg(v),
            BnView::Stat(v) => builder.arg(v),
        };
    }

    /// Rows `rows` (of `c` elements) of a statistics table.
    fn rows(&self, rows: std::ops::Range<usize>, c: usize) -> Result<CudaView<'_, S>> {
        match self {
            BnView::Stat(v) => Ok(v.slice(rows.start * c..rows.end * c)),
            BnView::Data(_) => bail!("batch-norm kernel: expected a statistics table"),
        }
    }
}

/// The typed views of the arguments: `stats` and `table` are statistics, the rest data.
pub(super) fn bn_views<'a, T: CudaDType, S: CudaDType>(
    args: &[(&'a CudaStorage, &Layout, &'static str)],
) -> Result<Vec<BnView<'a, T, S>>> {
    args.iter()
        .map(|(storage, layout, name)| match *name {
            "stats" | "table" => Ok(BnView::Stat(view::<S>(storage, layout, name)?)),
            _ => Ok(BnView::Data(view::<T>(storage, layout, name)?)),
        })
        .collect()
}

/// Element type `T` of the data, `S` of the statistics and tables (f32 for 16-bit data); a
/// `Table` pass updates `running` (when it has addresses).
fn run<T, S>(
    pass: BnPass,
    eps: f64,
    relu: bool,
    shape: BnShape,
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
    let (n, c, hw) = (shape.n as i32, shape.c as i32, shape.plane as i32);
    let m = (shape.n * shape.plane) as f64;
    let splits = shape.splits() as i32;
    let relu = i32::from(relu);
    // SAFETY (every launch below): the arguments match the kernel's signature in
    // kernels/batch_norm.cu, and every pointer addresses a live allocation of the length the
    // kernel reads or writes (checked shapes: statistics 2 x C, tables 4 x C or 6 x C;
    // `partial` holds `splits x 2C` doubles, each written by exactly one block of the partial
    // pass).
    match pass {
        BnPass::Moments | BnPass::GradSums | BnPass::Table | BnPass::GradTable => {
            let out = output::<S>(&device, out_len)?;
            let (partial_kernel, finalize_kernel) = match pass {
                BnPass::Moments => ("bn_moments_partial", "bn_moments_finalize"),
                BnPass::Table => ("bn_moments_partial", "bn_table_finalize"),
                BnPass::GradSums => ("bn_grad_sums_partial", "bn_grad_sums_finalize"),
                _ => ("bn_grad_sums_partial", "bn_grad_table_finalize"),
            };
            let partial = output::<f64>(&device, splits as usize * 2 * shape.c)?;
            let func = function(&device, &BATCH_NORM, partial_kernel, T::DTYPE)?;
            let mut builder = func.builder();
            // The moments read x; the gradient sums x, dy and the statistics (a table's
            // first two rows).
            let inputs = match pass {
                BnPass::Moments | BnPass::Table => &views[..1],
                _ => &views[..3],
            };
            for v in inputs {
                v.push(&mut builder);
            }
            builder.arg(&partial).arg(&n).arg(&c).arg(&hw);
            launched(partial_kernel, unsafe { builder.launch(shape.reduction()) })?;
            let func = function(&device, &BATCH_NORM, finalize_kernel, T::DTYPE)?;
            let mut builder = func.builder();
            match pass {
                BnPass::Moments | BnPass::Table => {
                    views[0].push(&mut builder);
                    builder.arg(&partial);
                    if let BnPass::Table = pass {
                        views[1].push(&mut builder);
                        views[2].push(&mut builder);
                    }
                    builder.arg(&out).arg(&c).arg(&hw).arg(&splits).arg(&m);
                    if let BnPass::Table = pass {
                        running.push(&mut builder);
                    }
                }
                _ => {
                    views[2].push(&mut builder);
                    builder.arg(&partial).arg(&out);
                    builder.arg(&c).arg(&splits).arg(&eps);
                }
            }
            launched(finalize_kernel, unsafe { builder.launch(shape.finalize()) })?;
            Ok(CudaStorage::wrap_cuda_slice(out, device))
        }
        BnPass::Forward | BnPass::ForwardTable | BnPass::GradInput => {
            let out = output::<T>(&device, out_len)?;
            let kernel = match pass {
                BnPass::GradInput => "bn_grad_input",
                BnPass::ForwardTable => "bn_forward_table",
                _ => "bn_forward",
            };
            let func = function(&device, &BATCH_NORM, kernel, T::DTYPE)?;
            let mut builder = func.builder();
            // From a [mean; var; weight; bias] table: affine = rows 2..4, stats = rows 0..2.
            let (affine, stats);
            match pass {
                BnPass::ForwardTable => {
                    affine = views[1].rows(2..4, shape.c)?;
                    stats = views[1].rows(0..2, shape.c)?;
                    views[0].push(&mut builder);
                    builder.arg(&affine).arg(&stats);
                }
                _ => {
                    for v in &views {
                        v.push(&mut builder);
                    }
                }
            }
            builder.arg(&out).arg(&c).arg(&hw);
            match pass {
                BnPass::GradInput => builder.arg(&m).arg(&eps),
                _ => builder.arg(&eps).arg(&relu),
            };
            launched(kernel, unsafe { builder.launch(shape.planes()) })?;
            Ok(CudaStorage::wrap_cuda_slice(out, device))
        }
        BnPass::ForwardTableAddRelu => {
            bail!("batch-norm kernel: the fused residual end is written for channels-last data")
        }
    }
}

/// Runs `pass` on CUDA arguments (x first); the result has `out_len` elements. `relu` applies
/// to the forward pass only.
pub(crate) fn run_cuda(
    pass: BnPass,
    eps: f64,
    relu: bool,
    shape: BnShape,
    args: &[(&CudaStorage, &Layout, &'static str)],
    out_len: usize,
    running: RunningTarget,
) -> Result<CudaStorage> {
    let elements = shape.n * shape.c * shape.plane;
    if shape.n * shape.plane > u32::MAX as usize || shape.n * shape.c > i32::MAX as usize {
        bail!("batch-norm kernel: x with {elements} elements is too large for the CUDA kernels");
    }
    match args[0].0.dtype() {
        DType::F32 => run::<f32, f32>(pass, eps, relu, shape, args, out_len, running),
        DType::F64 => run::<f64, f64>(pass, eps, relu, shape, args, out_len, running),
        DType::BF16 => run::<bf16, f32>(pass, eps, relu, shape, args, out_len, running),
        DType::F16 => run::<f16, f32>(pass, eps, relu, shape, args, out_len, running),
        other => bail!("batch-norm kernel: dtype {other:?} is not supported"),
    }
}

fn blend<T: CudaDType + DeviceRepr + WithDType, S: CudaDType>(
    running: &mut CudaStorage,
    range: std::ops::Range<usize>,
    batch: (&CudaStorage, &Layout),
    momentum: f64,
    scale: f64,
) -> Result<()> {
    let device = device_of(running);
    let n = range.len();
    let func = function(&device, &BATCH_NORM, "bn_blend_running", T::DTYPE)?;
    let src = view::<S>(batch.0, batch.1, "batch")?;
    let mut dst = running.as_cuda_slice_mut::<T>()?.slice_mut(range);
    let len = n as i32;
    let mut builder = func.builder();
    builder
        .arg(&mut dst)
        .arg(&src)
        .arg(&len)
        .arg(&momentum)
        .arg(&scale);
    let config = one_thread_each(n);
    // SAFETY: the arguments match `bn_blend_running` in kernels/batch_norm.cu; both views hold
    // `n` elements (checked by the caller).
    launched("bn_blend_running", unsafe { builder.launch(config) })
}

/// `running[range] = (1 - momentum) * running + momentum * scale * batch`, in place.
pub(crate) fn blend_running(
    running: &mut CudaStorage,
    range: std::ops::Range<usize>,
    batch: (&CudaStorage, &Layout),
    momentum: f64,
    scale: f64,
) -> Result<()> {
    match running.dtype() {
        DType::F32 => blend::<f32, f32>(running, range, batch, momentum, scale),
        DType::F64 => blend::<f64, f64>(running, range, batch, momentum, scale),
        DType::BF16 => blend::<bf16, f32>(running, range, batch, momentum, scale),
        DType::F16 => blend::<f16, f32>(running, range, batch, momentum, scale),
        other => bail!("blend_into: dtype {other:?} is not supported"),
    }
}

/// The `[mean; var; weight; bias]` table (f32) of `c` channels from `[sum; sum of squares]`
/// over `count` elements each (`bn_table_from_sums`, one thread a channel).
pub(super) fn table_from_sums(
    sums: (&CudaStorage, &Layout),
    weight: (&CudaStorage, &Layout),
    bias: (&CudaStorage, &Layout),
    c: usize,
    count: f64,
) -> Result<CudaStorage> {
    match weight.0.dtype() {
        DType::BF16 => launch_table_from_sums::<bf16>(sums, weight, bias, c, count),
        DType::F16 => launch_table_from_sums::<f16>(sums, weight, bias, c, count),
        _ => launch_table_from_sums::<f32>(sums, weight, bias, c, count),
    }
}

fn launch_table_from_sums<T: CudaDType + DeviceRepr + WithDType>(
    sums: (&CudaStorage, &Layout),
    weight: (&CudaStorage, &Layout),
    bias: (&CudaStorage, &Layout),
    c: usize,
    count: f64,
) -> Result<CudaStorage> {
    let device = device_of(sums.0);
    let sums = view::<f32>(sums.0, sums.1, "sums")?;
    let weight = view::<T>(weight.0, weight.1, "weight")?;
    let bias = view::<T>(bias.0, bias.1, "bias")?;
    let out = output::<f32>(&device, 4 * c)?;
    let func = function(&device, &BATCH_NORM, "bn_table_from_sums", T::DTYPE)?;
    let channels = c as i32;
    let mut builder = func.builder();
    builder
        .arg(&sums)
        .arg(&weight)
        .arg(&bias)
        .arg(&out)
        .arg(&channels)
        .arg(&count);
    // SAFETY: the arguments match `bn_table_from_sums` in kernels/batch_norm.cu; the op checked
    // 2C sums and C weights and biases, and the C threads write the 4C values of the table.
    launched("bn_table_from_sums", unsafe {
        builder.launch(one_thread_each(c))
    })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}
