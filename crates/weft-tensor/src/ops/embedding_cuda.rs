//! Launches the kernels of `kernels/embedding.cu`: the forward with a thread per unit of columns
//! (16 bytes of them when the width is a multiple of that, one column otherwise) and tokens
//! across the block's and the grid's second dimension, as `bias_cuda` lays out rows; the
//! table's gradient with a block of 256 threads per run of consecutive vocabulary rows whose
//! f32 sums (f64 for f64) fill at most 45 KiB of shared memory (15 rows of GPT-2's 768
//! columns: 3354 blocks over a padded vocabulary of 50304); the positions' gradient
//! grid-stride over units of columns.

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use half::{bf16, f16};

use super::cuda_launch::{
    device_of, function, grid_stride, launched, output, view, EMBEDDING, THREADS,
};

/// `TABLE_GRAD_THREADS` of kernels/embedding.cu: the table gradient's blocks must be this wide.
const TABLE_GRAD_THREADS: u32 = 256;

/// The shared memory a table-gradient block's sums may take: with the kernel's 2 KiB of lists,
/// within the 48 KiB a block has without opting in to more.
const ACCUMULATOR_BYTES: usize = 45 * 1024;

/// Elements of `T` in 16 bytes: the kernels' unit of columns when the width is a multiple of it.
fn lanes<T>() -> usize {
    16 / std::mem::size_of::<T>()
}

/// `value` as the kernels' `int`, or an error naming what it counts.
fn int(name: &str, what: &str, value: usize) -> Result<i32> {
    match i32::try_from(value) {
        Ok(v) => Ok(v),
        Err(_) => bail!("{name}: {value} {what} are beyond the kernel's int indices"),
    }
}

/// The forward's blocks and grid over `tokens` rows of `cols` columns: threads across the units
/// of a row, as many rows across a block's second dimension as fill 256 threads.
fn forward_geometry(lanes: usize, tokens: usize, cols: usize) -> LaunchConfig {
    let units = if cols.is_multiple_of(lanes) {
        cols / lanes
    } else {
        cols
    };
    let threads = units.next_multiple_of(32).clamp(32, THREADS as usize) as u32;
    let rows_per_block = THREADS / threads;
    LaunchConfig {
        grid_dim: (
            (units as u32).div_ceil(threads).max(1),
            tokens.div_ceil(rows_per_block as usize).clamp(1, 65_535) as u32,
            1,
        ),
        block_dim: (threads, rows_per_block, 1),
        shared_mem_bytes: 0,
    }
}

fn forward_typed<T: CudaDType + DeviceRepr + WithDType>(
    table: (&CudaStorage, &Layout),
    positions: (&CudaStorage, &Layout),
    ids: (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let name = "embedding_forward";
    let (vocab, cols) = table.1.shape().dims2()?;
    let (batch, seq) = ids.1.shape().dims2()?;
    let tokens = batch * seq;
    let device = device_of(table.0);
    let tv = view::<T>(table.0, table.1, name)?;
    let pv = view::<T>(positions.0, positions.1, name)?;
    let iv = view::<u32>(ids.0, ids.1, name)?;
    let out = output::<T>(&device, tokens * cols)?;
    let func = function(&device, &EMBEDDING, name, T::DTYPE)?;
    let (tokens32, seq32) = (int(name, "tokens", tokens)?, int(name, "positions", seq)?);
    let (vocab32, cols32) = (int(name, "rows", vocab)?, int(name, "columns", cols)?);
    let mut builder = func.builder();
    builder.arg(&tv).arg(&pv).arg(&iv).arg(&out);
    builder
        .arg(&tokens32)
        .arg(&seq32)
        .arg(&vocab32)
        .arg(&cols32);
    // SAFETY: the arguments match `embedding_forward_*` in kernels/embedding.cu; the table
    // holds `vocab × cols` elements, the positions `seq × cols` and the ids `tokens` (checked
    // by the op), the kernel reads a table row only for an id below `vocab`, and it writes
    // every element of the output (its threads cover every unit of columns, and its tokens
    // stride over all tokens).
    launched(name, unsafe {
        builder.launch(forward_geometry(lanes::<T>(), tokens, cols))
    })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

fn table_grad_typed<T: CudaDType + DeviceRepr + WithDType>(
    dy: (&CudaStorage, &Layout),
    ids: (&CudaStorage, &Layout),
    vocab: usize,
) -> Result<CudaStorage> {
    let name = "embedding_table_grad";
    let (batch, seq, cols) = dy.1.shape().dims3()?;
    let sum_bytes = match T::DTYPE {
        DType::F64 => 8,
        _ => 4,
    };
    let row_bytes = cols * sum_bytes;
    if row_bytes > ACCUMULATOR_BYTES {
        let most = ACCUMULATOR_BYTES / sum_bytes;
        bail!("{name}: {cols} columns, the kernel's shared memory holds rows of {most} at most");
    }
    let rows_per_block = (ACCUMULATOR_BYTES / row_bytes).min(vocab.max(1));
    let blocks = vocab.div_ceil(rows_per_block).max(1);
    let device = device_of(dy.0);
    let dyv = view::<T>(dy.0, dy.1, name)?;
    let iv = view::<u32>(ids.0, ids.1, name)?;
    let out = output::<T>(&device, vocab * cols)?;
    let func = function(&device, &EMBEDDING, name, T::DTYPE)?;
    // The blocks' sums, not their L1 cache, bound how many an SM holds.
    func.prefer_shared_memory()?;
    let tokens = int(name, "tokens", batch * seq)?;
    let (vocab32, cols32) = (int(name, "rows", vocab)?, int(name, "columns", cols)?);
    let rows32 = int(name, "rows", rows_per_block)?;
    let mut builder = func.builder();
    builder.arg(&iv).arg(&dyv).arg(&out);
    builder.arg(&tokens).arg(&vocab32).arg(&cols32).arg(&rows32);
    let config = LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (TABLE_GRAD_THREADS, 1, 1),
        shared_mem_bytes: (rows_per_block * row_bytes) as u32,
    };
    // SAFETY: the arguments match `embedding_table_grad_*` in kernels/embedding.cu; dy holds
    // `tokens × cols` elements and the ids `tokens` (checked by the op); the blocks are
    // TABLE_GRAD_THREADS wide, as the kernel's scan assumes; block `k` owns rows
    // `[k · rows_per_block, + rows_per_block)` below `vocab`, their sums fit the dynamic
    // shared memory asked for (at most ACCUMULATOR_BYTES), and the blocks cover every row, so
    // every element of the output is written; an id not below `vocab` matches no block.
    launched(name, unsafe { builder.launch(config) })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

fn positions_grad_typed<T: CudaDType + DeviceRepr + WithDType>(
    dy: (&CudaStorage, &Layout),
    position_rows: usize,
) -> Result<CudaStorage> {
    let name = "embedding_positions_grad";
    let (batch, seq, cols) = dy.1.shape().dims3()?;
    let len = position_rows * cols;
    let device = device_of(dy.0);
    let dyv = view::<T>(dy.0, dy.1, name)?;
    let out = output::<T>(&device, len)?;
    let func = function(&device, &EMBEDDING, name, T::DTYPE)?;
    let (batch32, cols32) = (int(name, "sequences", batch)?, int(name, "columns", cols)?);
    let (per_batch, len64) = ((seq * cols) as i64, len as i64);
    let mut builder = func.builder();
    builder.arg(&dyv).arg(&out);
    builder
        .arg(&batch32)
        .arg(&per_batch)
        .arg(&len64)
        .arg(&cols32);
    let units = match cols.is_multiple_of(lanes::<T>()) {
        true => len / lanes::<T>(),
        false => len,
    };
    // SAFETY: the arguments match `embedding_positions_grad_*` in kernels/embedding.cu; dy
    // holds `batch × seq × cols` elements and `seq <= position_rows` (checked by the op), and
    // the kernel's grid-stride loop writes every one of the output's `len` elements.
    launched(name, unsafe { builder.launch(grid_stride(units)) })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// `table[ids] + positions` over contiguous CUDA tensors: a table `[V, C]`, positions `[T, C]`
/// of its type and u32 ids `[B, T]`.
pub(crate) fn forward(
    table: (&CudaStorage, &Layout),
    positions: (&CudaStorage, &Layout),
    ids: (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    match table.0.dtype() {
        DType::F32 => forward_typed::<f32>(table, positions, ids),
        DType::F64 => forward_typed::<f64>(table, positions, ids),
        DType::BF16 => forward_typed::<bf16>(table, positions, ids),
        DType::F16 => forward_typed::<f16>(table, positions, ids),
        other => bail!("embed_tokens: dtype {other:?} has no CUDA kernel"),
    }
}

/// The table's gradient `[vocab, C]` from contiguous CUDA `dy` (`[B, T, C]`) and u32 ids.
pub(crate) fn table_grad(
    dy: (&CudaStorage, &Layout),
    ids: (&CudaStorage, &Layout),
    vocab: usize,
) -> Result<CudaStorage> {
    match dy.0.dtype() {
        DType::F32 => table_grad_typed::<f32>(dy, ids, vocab),
        DType::F64 => table_grad_typed::<f64>(dy, ids, vocab),
        DType::BF16 => table_grad_typed::<bf16>(dy, ids, vocab),
        DType::F16 => table_grad_typed::<f16>(dy, ids, vocab),
        other => bail!("embed_tokens_backward: dtype {other:?} has no CUDA kernel"),
    }
}

/// The positions' gradient `[position_rows, C]` from contiguous CUDA `dy` (`[B, T, C]`).
pub(crate) fn positions_grad(
    dy: (&CudaStorage, &Layout),
    position_rows: usize,
) -> Result<CudaStorage> {
    match dy.0.dtype() {
        DType::F32 => positions_grad_typed::<f32>(dy, position_rows),
        DType::F64 => positions_grad_typed::<f64>(dy, position_rows),
        DType::BF16 => positions_grad_typed::<bf16>(dy, position_rows),
        DType::F16 => positions_grad_typed::<f16>(dy, position_rows),
        other => bail!("embed_tokens_backward: dtype {other:?} has no CUDA kernel"),
    }
}
