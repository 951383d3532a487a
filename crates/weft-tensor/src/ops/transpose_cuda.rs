//! Launches the batched transposes of `kernels/transpose.cu`: a contiguous `[batch, rows,
//! cols]` CUDA tensor into a contiguous `[batch, cols, rows]` one, in 32 x 32 tiles through
//! shared memory (Candle's strided copy of the same permutation reads or writes across rows and
//! ran at about a tenth of the memory's bandwidth on ResNet-50's 3 x 3 filters).

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::cuda_launch::{device_of, function_named, launched, output, view, TRANSPOSE};

/// The tile's side and the rows of threads that move it.
const TILE: usize = 32;
const THREAD_ROWS: u32 = 8;
/// The largest grid extent along y and z.
const GRID_LIMIT: usize = 65_535;

/// Whether the kernel takes `[batch, rows, cols]` of `dtype` (an element size it moves, the
/// grid's y and z extents, 32-bit sides).
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
    let func = function_named(&device, &TRANSPOSE, kernel)?;
    let mut builder = func.builder();
    let (rows_i, cols_i) = (rows as i32, cols as i32);
    builder.arg(&input).arg(&out).arg(&rows_i).arg(&cols_i);
    let config = LaunchConfig {
        grid_dim: (
            cols.div_ceil(TILE) as u32,
            rows.div_ceil(TILE) as u32,
            batch as u32,
        ),
        block_dim: (TILE as u32, THREAD_ROWS, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match the kernel's signature in kernels/transpose.cu (T has the
    // kernel's element size); the input holds batch * rows * cols contiguous elements and the
    // output as many; the grid covers every tile.
    launched(kernel, unsafe { builder.launch(config) })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// `t` (contiguous `[batch, rows, cols]` on a GPU) as a contiguous `[batch, cols, rows]`.
pub(super) fn transpose_batched(t: &Tensor) -> Result<Tensor> {
    t.apply_op1_no_bwd(&BatchedTranspose)
}
