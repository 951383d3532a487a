//! Launches the batched transposes of `kernels/transpose.cu`: a contiguous `[batch, rows,
//! cols]` CUDA tensor into a contiguous `[batch, cols, rows]` one, in 32 x 32 tiles through
//! shared memory (Candle's strided copy of the same permutation reads or writes across rows and
//! ran at about a tenth of the memory's bandwidth on ResNet-50's 3 x 3 filters), or, for thin
//! planes that fit in shared memory (a 3 x 3 filter's `C x 9`), a whole plane per block: the
//! tiles left 23 of their 32 columns idle there, and layer4's 512 x 512 x 3 x 3 filter took
//! 21 µs in bf16 (0.45 TB/s; 9-10 µs by plane; docs/history/2026-11.md, twenty-seventh session).

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::cuda_launch::{device_of, function_named, launched, output, view, THREADS, TRANSPOSE};

/// The tile's side and the rows of threads that move it.
const TILE: usize = 32;
const THREAD_ROWS: u32 = 8;
/// The largest grid extent along y and z.
const GRID_LIMIT: usize = 65_535;
/// The most shared memory a plane may take (the default limit of a block, no opt-in).
const PLANE_BYTES: usize = 48 << 10;

/// The shared memory a `[rows, cols]` plane of `element` bytes takes in `transpose_plane`
/// (rows `cols | 1` elements apart).
fn plane_bytes(element: usize, rows: usize, cols: usize) -> usize {
    rows * (cols | 1) * element
}

/// Whether `[rows, cols]` planes of `element` bytes go one per block: a side under a tile's
/// and the plane within [`PLANE_BYTES`].
fn by_plane(element: usize, rows: usize, cols: usize) -> bool {
    rows.min(cols) < TILE && plane_bytes(element, rows, cols) <= PLANE_BYTES
}

/// Whether the kernels take `[batch, rows, cols]` of `dtype` (an element size they move, the
/// grids' y and z extents, 32-bit sides).
pub(super) fn fits(dtype: DType, (batch, rows, cols): (usize, usize, usize)) -> bool {
    kernel_of(dtype).is_some()
        && batch <= GRID_LIMIT
        && rows.div_ceil(TILE) <= GRID_LIMIT
        && cols <= i32::MAX as usize
}

/// The kernel that moves elements of `dtype`.
fn kernel_of(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::BF16 | DType::F16 => Some("transpose_b2"),
        DType::F32 | DType::U32 => Some("transpose_b4"),
        DType::F64 | DType::I64 => Some("transpose_b8"),
        _ => None,
    }
}

struct BatchedTranspose;

impl CustomOp1 for BatchedTranspose {
    fn name(&self) -> &'static str {
        "weft-batched-transpose"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        bail!("weft-batched-transpose: CUDA tensors only")
    }

    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        let &[batch, rows, cols] = layout.shape().dims() else {
            bail!(
                "weft-batched-transpose: takes [batch, rows, cols], not {:?}",
                layout.shape()
            );
        };
        let dtype = storage.dtype();
        let Some(kernel) = kernel_of(dtype) else {
            bail!("weft-batched-transpose: dtype {dtype:?} is not supported");
        };
        let out = match dtype {
            DType::F32 => launch::<f32>(storage, layout, kernel)?,
            DType::U32 => launch::<u32>(storage, layout, kernel)?,
            DType::F64 => launch::<f64>(storage, layout, kernel)?,
            DType::I64 => launch::<i64>(storage, layout, kernel)?,
            DType::BF16 => launch::<half::bf16>(storage, layout, kernel)?,
            _ => launch::<half::f16>(storage, layout, kernel)?,
        };
        Ok((out, Shape::from((batch, cols, rows))))
    }
}

fn launch<T: CudaDType + DeviceRepr>(
    storage: &CudaStorage,
    layout: &Layout,
    kernel: &str,
) -> Result<CudaStorage> {
    let &[batch, rows, cols] = layout.shape().dims() else {
        bail!("weft-batched-transpose: takes [batch, rows, cols]");
    };
    if !fits(storage.dtype(), (batch, rows, cols)) {
        bail!("weft-batched-transpose: [{batch}, {rows}, {cols}] exceeds the grid");
    }
    let device = device_of(storage);
    let input = view::<T>(storage, layout, kernel)?;
    let out = output::<T>(&device, batch * rows * cols)?;
    let element = std::mem::size_of::<T>();
    let (kernel, config) = match by_plane(element, rows, cols) {
        true => (
            kernel.replace("transpose_", "transpose_plane_"),
            LaunchConfig {
                grid_dim: (batch as u32, 1, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: plane_bytes(element, rows, cols) as u32,
            },
        ),
        false => (
            kernel.to_string(),
            LaunchConfig {
                grid_dim: (
                    cols.div_ceil(TILE) as u32,
                    rows.div_ceil(TILE) as u32,
                    batch as u32,
                ),
                block_dim: (TILE as u32, THREAD_ROWS, 1),
                shared_mem_bytes: 0,
            },
        ),
    };
    let func = function_named(&device, &TRANSPOSE, &kernel)?;
    let mut builder = func.builder();
    let (rows_i, cols_i) = (rows as i32, cols as i32);
    builder.arg(&input).arg(&out).arg(&rows_i).arg(&cols_i);
    // SAFETY: the arguments match the kernels' signature in kernels/transpose.cu (T has the
    // kernel's element size); the input holds batch * rows * cols contiguous elements and the
    // output as many; the grid covers every tile, or every plane with the shared memory it
    // takes (`plane_bytes`).
    launched(&kernel, unsafe { builder.launch(config) })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// `t` (contiguous `[batch, rows, cols]` on a GPU) as a contiguous `[batch, cols, rows]`.
pub(super) fn transpose_batched(t: &Tensor) -> Result<Tensor> {
    t.apply_op1_no_bwd(&BatchedTranspose)
}
