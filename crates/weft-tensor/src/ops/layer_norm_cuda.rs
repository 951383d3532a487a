//! Launches the LayerNorm kernels of `kernels/layer_norm.cu`. f32/f64: one block of 256 threads
//! per row (forward, statistics, input gradient). bf16/f16: one warp per row, 16-bit values
//! with f32 arithmetic inside; the forward, and the fused backward — the input gradient and
//! each block's f32 column sums for the weight and bias gradients, then a second kernel adding
//! the blocks' sums in a fixed order.

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::cuda_backend::CudaDevice;
use candle_core::op::BackpropOp;
use candle_core::{bail, DType, Layout, Result, Shape, Storage, Tensor, WithDType};
use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use half::{bf16, f16};

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

/// Runs `pass` over `rows × cols` values: every pass for f32/f64, the forward for bf16/f16
/// (their backward is [`backward_half`]).
pub(crate) fn run(
    pass: Pass,
    rows: usize,
    cols: usize,
    eps: f64,
    args: &[(&CudaStorage, &Layout); 3],
) -> Result<CudaStorage> {
    match (args[0].0.dtype(), pass) {
        (DType::F32, _) => launch::<f32>(pass, (rows, cols, eps), args),
        (DType::F64, _) => launch::<f64>(pass, (rows, cols, eps), args),
        (DType::BF16, Pass::Forward) => forward_half::<bf16>(Norm::Layer, (rows, cols, eps), args),
        (DType::F16, Pass::Forward) => forward_half::<f16>(Norm::Layer, (rows, cols, eps), args),
        (other, _) => bail!("layer_norm: dtype {other:?} has no CUDA kernel for {pass:?}"),
    }
}

/// Warps (rows at a time) of a block of the 16-bit kernels.
/// Which normalisation the 16-bit kernels compute: LayerNorm (`layer_norm_*`) or RMSNorm
/// (`rms_norm_*`: no mean, no bias; its backward's bias sums are computed and dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Norm {
    Layer,
    Rms,
}

impl Norm {
    fn kernel(self, pass: &str) -> &'static str {
        match (self, pass) {
            (Norm::Layer, "forward") => "layer_norm_forward",
            (Norm::Layer, _) => "layer_norm_backward",
            (Norm::Rms, "forward") => "rms_norm_forward",
            (Norm::Rms, _) => "rms_norm_backward",
        }
    }
}

const HALF_WARPS: usize = 8;

/// `rows` and `cols` as the 16-bit kernels' int arguments.
fn half_dims(name: &str, rows: usize, cols: usize) -> Result<(i32, i32)> {
    match (i32::try_from(rows), i32::try_from(cols)) {
        (Ok(r), Ok(c)) if r > 0 && c > 0 => Ok((r, c)),
        _ => bail!("{name}: {rows} x {cols} is empty or beyond the kernel's int indices"),
    }
}

/// The SMs of `storage`'s device.
fn multiprocessors(storage: &CudaStorage) -> Result<usize> {
    let sms = storage
        .device()
        .cuda_stream()
        .context()
        .attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| candle_core::Error::Msg(format!("CUDA device attribute: {e:?}")))?;
    Ok(usize::try_from(sms).unwrap_or(1).max(1))
}

/// The 16-bit forward: a warp per row. Rows of 16-byte vectors (`cols` a multiple of 8) on two
/// blocks per SM, each warp loading its next row while it works on one (17.6 µs for 16384 rows
/// of 768 on an H200, 2.9 TB/s, against 20 µs with a warp for each row and 120 µs for the
/// former f32 kernel between two conversions); other rows one per warp (the faster there).
pub(crate) fn forward_half<T: CudaDType + DeviceRepr + WithDType>(
    norm: Norm,
    (rows, cols, eps): (usize, usize, f64),
    args: &[(&CudaStorage, &Layout)],
) -> Result<CudaStorage> {
    let name = norm.kernel("forward");
    let (r, c) = half_dims(name, rows, cols)?;
    let device = device_of(args[0].0);
    let views = args
        .iter()
        .map(|(storage, layout)| view::<T>(storage, layout, name))
        .collect::<Result<Vec<_>>>()?;
    let out = output::<T>(&device, rows * cols)?;
    let one_row_each = rows.div_ceil(HALF_WARPS);
    let blocks = match cols.is_multiple_of(8) {
        true => one_row_each.min(2 * multiprocessors(args[0].0)?),
        false => one_row_each,
    };
    let func = function(&device, &LAYER_NORM, name, T::DTYPE)?;
    let mut builder = func.builder();
    for v in &views {
        builder.arg(v);
    }
    let eps = eps as f32;
    builder.arg(&out).arg(&r).arg(&c).arg(&eps);
    let config = LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (32 * HALF_WARPS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `layer_norm_forward_{bf16,f16}` (x, w, b) or
    // `rms_norm_forward_{bf16,f16}` (x, w) in kernels/layer_norm.cu; x holds `rows × cols`
    // elements and the weight and bias `cols` (checked by the op); the grid's warps take every
    // row, and the kernel writes every element of the output.
    launched(name, unsafe { builder.launch(config) })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// The widest rows of the fused 16-bit backward: one warp's f32 column sums (`2 × cols`,
/// rounded up to whole slots of 32 units) fill a block's 48 KiB of shared memory.
pub(crate) const MAX_BACKWARD_COLS: usize = 6144;

/// Shared memory of one block without an opt-in.
const SHARED_PER_BLOCK: usize = 48 * 1024;
/// Shared memory that the backward's blocks take on one SM at most (an H100's or H200's 228
/// KiB, less the 1 KiB each block reserves; the driver picks the carveout).
const SHARED_PER_SM: usize = 220 * 1024;
/// Warps of the backward that an SM holds: 128 registers a thread (the kernel's launch
/// bounds) fill its 64K registers with 16 warps.
const WARPS_PER_SM: usize = 16;

/// The launch of the fused backward over `rows × cols`: `warps` per block, the first of 8, 4,
/// 3, 2 and 1 whose column sums a block's shared memory holds, each block owning
/// `rows_per_block` consecutive rows; one wave of blocks filling every SM. On an H200 with
/// 16384 rows: 768 columns, 8 warps a block, 36 µs (2.1 TB/s of x, dy and dx); 1024 and 1280,
/// 4 warps, 49 and 61 µs; 1600, 3 warps, 100 µs (fewer warps a block were slower at every
/// width, as was asking for the largest shared-memory carveout).
struct BackwardGeometry {
    warps: usize,
    blocks: usize,
    rows_per_block: usize,
    shared_bytes: usize,
}

impl BackwardGeometry {
    fn new(rows: usize, cols: usize, sms: usize) -> Self {
        // One warp's column sums, as `ColumnSums` in kernels/layer_norm.cu lays them out: units
        // of 8 columns (16-byte vectors) when cols is a multiple of 8 — the larger of the
        // kernel's two layouts, so also enough when unaligned rows take single columns.
        let unit = if cols.is_multiple_of(8) { 8 } else { 1 };
        let per_warp = (cols / unit).div_ceil(32) * 32 * 2 * unit * std::mem::size_of::<f32>();
        let warps_per_sm = WARPS_PER_SM.min(SHARED_PER_SM / per_warp);
        let warps = [8, 4, 3, 2, 1]
            .into_iter()
            .find(|&w| w <= warps_per_sm && w * per_warp <= SHARED_PER_BLOCK)
            .unwrap_or(1);
        let rows_per_block = rows.div_ceil(sms * (warps_per_sm / warps).max(1));
        Self {
            warps,
            blocks: rows.div_ceil(rows_per_block),
            rows_per_block,
            shared_bytes: warps * per_warp,
        }
    }
}

/// The CUDA storage of `storage`, or an error naming the op.
fn cuda_storage<'a>(storage: &'a Storage, name: &str) -> Result<&'a CudaStorage> {
    match storage {
        Storage::Cuda(cuda) => Ok(cuda),
        _ => bail!("{name}: a tensor is not on a CUDA device"),
    }
}

/// A tensor of `shape` over a new CUDA buffer (no autograd history).
fn tensor_of<T: CudaDType>(
    slice: CudaSlice<T>,
    device: &CudaDevice,
    shape: impl Into<Shape>,
) -> Tensor {
    let storage = CudaStorage::wrap_cuda_slice(slice, device.clone());
    Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
}

fn backward<T: CudaDType + DeviceRepr + WithDType>(
    norm: Norm,
    x: &Tensor,
    weight: &Tensor,
    dy: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let name = norm.kernel("backward");
    let (rows, cols) = x.dims2()?;
    if dy.dims() != x.dims() || weight.dims() != [cols] {
        bail!(
            "{name}: x {:?}, dy {:?} and weight {:?}",
            x.dims(),
            dy.dims(),
            weight.dims()
        );
    }
    if cols > MAX_BACKWARD_COLS {
        bail!("{name}: {cols} columns, the 16-bit kernel takes {MAX_BACKWARD_COLS} at most");
    }
    let (r, c) = half_dims(name, rows, cols)?;
    let (x_storage, x_layout) = x.storage_and_layout();
    let (w_storage, w_layout) = weight.storage_and_layout();
    let (dy_storage, dy_layout) = dy.storage_and_layout();
    let x_cuda = cuda_storage(&x_storage, name)?;
    let xv = view::<T>(x_cuda, x_layout, name)?;
    let wv = view::<T>(cuda_storage(&w_storage, name)?, w_layout, name)?;
    let dyv = view::<T>(cuda_storage(&dy_storage, name)?, dy_layout, name)?;
    let device = device_of(x_cuda);
    let geometry = BackwardGeometry::new(rows, cols, multiprocessors(x_cuda)?);
    let dx = output::<T>(&device, rows * cols)?;
    let partial = output::<f32>(&device, geometry.blocks * 2 * cols)?;
    let func = function(&device, &LAYER_NORM, name, T::DTYPE)?;
    let (eps, rows_per_block) = (eps as f32, geometry.rows_per_block as i32);
    let mut builder = func.builder();
    builder.arg(&xv).arg(&wv).arg(&dyv).arg(&dx).arg(&partial);
    builder.arg(&r).arg(&c).arg(&eps).arg(&rows_per_block);
    let config = LaunchConfig {
        grid_dim: (geometry.blocks as u32, 1, 1),
        block_dim: (32 * geometry.warps as u32, 1, 1),
        shared_mem_bytes: geometry.shared_bytes as u32,
    };
    // SAFETY: the arguments match `{layer,rms}_norm_backward_{bf16,f16}` in kernels/layer_norm.cu;
    // x, dy and dx hold `rows × cols` elements and the weight `cols` (checked above); the
    // blocks own `rows_per_block` rows each and cover every row, each block writes its own
    // `2 × cols` row of `partial` (`blocks` rows), and the shared memory holds the column sums
    // of every warp of a block (`BackwardGeometry`, at most 48 KiB).
    launched(name, unsafe { builder.launch(config) })?;
    let sums = "layer_norm_backward_sums";
    let (dw, db) = (output::<T>(&device, cols)?, output::<T>(&device, cols)?);
    let blocks = geometry.blocks as i32;
    let func = function(&device, &LAYER_NORM, sums, T::DTYPE)?;
    let mut builder = func.builder();
    builder.arg(&partial).arg(&dw).arg(&db).arg(&blocks).arg(&c);
    let config = LaunchConfig {
        grid_dim: ((2 * cols).div_ceil(32) as u32, 1, 1),
        block_dim: (32, 32, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `layer_norm_backward_sums_{bf16,f16}`; `partial` holds
    // `blocks × 2 cols` values written by the launch before on the same stream, and the
    // kernel's blocks of 32 columns of `[dw | db]` write every element of both.
    launched(sums, unsafe { builder.launch(config) })?;
    Ok((
        tensor_of(dx, &device, (rows, cols)),
        tensor_of(dw, &device, cols),
        tensor_of(db, &device, cols),
    ))
}

/// The gradients `(dx, dw, db)` of LayerNorm for contiguous CUDA `x` and `dy` (`[rows, cols]`)
/// and `weight` (`[cols]`) of one 16-bit dtype, `cols` at most [`MAX_BACKWARD_COLS`].
pub(crate) fn backward_half(
    norm: Norm,
    x: &Tensor,
    weight: &Tensor,
    dy: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    match x.dtype() {
        DType::BF16 => backward::<bf16>(norm, x, weight, dy, eps),
        DType::F16 => backward::<f16>(norm, x, weight, dy, eps),
        other => bail!("layer_norm_backward: dtype {other:?} has no 16-bit CUDA kernel"),
    }
}
