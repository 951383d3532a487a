//! Token plus position embeddings, graph-free, with their own backward. For ids `[B, T]` (u32),
//! a table `[V, C]` and positions `[P, C]` (`P >= T`), [`embed_tokens`] gives
//! `table[ids[b, t]] + positions[t]` (`[B, T, C]`), and [`embed_tokens_backward`] the table's
//! gradient (row `v` the sum of the output gradient's rows of the tokens whose id is `v`, zero
//! for the ids not present) and the positions' (row `t` the sum over the batch, zero past `T`).
//! Every sum runs in token order (the batch's order for the positions): deterministic. On a GPU
//! this replaces Candle's `index_add` backward, a thread per column looping over every token
//! with a global read-modify-write, in 16 bits for 16-bit data.
//!
//! The CPU kernels sum f32 and f64 in f64 and compute bf16 and f16 in f32, rounded once; an id
//! past the table is an error naming it. With the `cuda` feature, CUDA f32, f64, bf16 and f16
//! tensors run `kernels/embedding.cu` (sums in f32, f64 for f64; 16-bit values read and written
//! as they are). There the ids are not checked on the host, which would read the device every
//! step (the op runs inside CUDA-graph captures): an id past the table is never read, its output
//! row is NaN (and so is the loss), and its gradient is dropped. Other tensors (CUDA ones with
//! weft's kernels off) take Candle's ops.

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor,
};
use rayon::prelude::*;

use super::storage::{run_kernel, uses_kernels_with_half, Arg, CpuKernel, Float};

/// `table[ids[b, t]] + positions[t]` for ids `[B, T]` (u32), a table `[V, C]` and positions
/// `[P, C]` with `P >= T`: `[B, T, C]`, without an autograd graph.
pub fn embed_tokens(table: &Tensor, positions: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let op = "embed_tokens";
    let (b, t) = ids_dims(op, ids)?;
    let (_, c) = table.dims2()?;
    let (p, position_cols) = positions.dims2()?;
    if c == 0 || position_cols != c || p < t || positions.dtype() != table.dtype() {
        bail!(
            "{op}: table {:?} ({:?}) and positions {:?} ({:?}) for sequences of {t} tokens",
            table.dims(),
            table.dtype(),
            positions.dims(),
            positions.dtype()
        );
    }
    let positions = positions.narrow(0, 0, t)?;
    if !uses_kernels_with_half(&[table, &positions]) {
        let rows = table.embedding(&ids.flatten_all()?)?.reshape((b, t, c))?;
        return Ok(rows.broadcast_add(&positions)?.detach());
    }
    table
        .contiguous()?
        .apply_op3_no_bwd(&positions.contiguous()?, &ids.contiguous()?, &EmbedTokens)
}

/// The gradients of [`embed_tokens`] from the output's gradient `dy` (`[B, T, C]`):
/// `(d_table, d_positions)`, `[vocab_rows, C]` and `[position_rows, C]`, in `dy`'s dtype.
pub fn embed_tokens_backward(
    ids: &Tensor,
    dy: &Tensor,
    vocab_rows: usize,
    position_rows: usize,
) -> Result<(Tensor, Tensor)> {
    let op = "embed_tokens_backward";
    let (b, t) = ids_dims(op, ids)?;
    let (dy_b, dy_t, c) = dy.dims3()?;
    if (dy_b, dy_t) != (b, t) || c == 0 || position_rows < t {
        bail!(
            "{op}: dy {:?} for ids {:?} and {position_rows} positions",
            dy.dims(),
            ids.dims()
        );
    }
    let d_table = lookup_backward(ids, dy, vocab_rows)?;
    if !uses_kernels_with_half(&[dy]) {
        let zeros = Tensor::zeros((position_rows - t, c), dy.dtype(), dy.device())?;
        return Ok((d_table, Tensor::cat(&[&dy.sum(0)?, &zeros], 0)?));
    }
    let d_positions = dy
        .contiguous()?
        .apply_op1_no_bwd(&PositionsGrad { position_rows })?;
    Ok((d_table, d_positions))
}

/// The gradient of a table looked up by ids `[B, T]` (u32) from the rows' gradient `dy`
/// (`[B, T, C]`): `[vocab_rows, C]`, row `v` the sum of the rows of the tokens whose id is `v`
/// in token order; [`embed_tokens_backward`]'s table half, for embeddings without positions.
pub fn lookup_backward(ids: &Tensor, dy: &Tensor, vocab_rows: usize) -> Result<Tensor> {
    let op = "lookup_backward";
    let (b, t) = ids_dims(op, ids)?;
    let (dy_b, dy_t, c) = dy.dims3()?;
    if (dy_b, dy_t) != (b, t) || c == 0 {
        bail!("{op}: dy {:?} for ids {:?}", dy.dims(), ids.dims());
    }
    if !uses_kernels_with_half(&[dy]) {
        let zeros = Tensor::zeros((vocab_rows, c), dy.dtype(), dy.device())?;
        return zeros.index_add(&ids.flatten_all()?, &dy.reshape((b * t, c))?, 0);
    }
    dy.contiguous()?
        .apply_op2_no_bwd(&ids.contiguous()?, &TableGrad { vocab_rows })
}

/// The dimensions of u32 ids `[B, T]`.
fn ids_dims(op: &str, ids: &Tensor) -> Result<(usize, usize)> {
    if ids.dtype() != DType::U32 {
        bail!("{op}: ids must be u32, got {:?}", ids.dtype());
    }
    ids.dims2()
}

/// The ids of a contiguous u32 CPU argument.
fn id_slice<'a>(op: &str, storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [u32]> {
    let (CpuStorage::U32(ids), Some((start, end))) = (storage, layout.contiguous_offsets()) else {
        bail!("{op}: ids must be contiguous u32");
    };
    Ok(&ids[start..end])
}

/// An error naming the first id not below `rows`, if any.
fn check_ids(op: &str, ids: &[u32], rows: usize) -> Result<()> {
    match ids.iter().position(|&id| id as usize >= rows) {
        Some(i) => bail!(
            "{op}: token {i} has id {}, past the table's {rows} rows",
            ids[i]
        ),
        None => Ok(()),
    }
}

/// `(table, positions [T, C], ids) -> [B, T, C]`.
struct EmbedTokens;

struct ForwardKernel<'a> {
    ids: &'a [u32],
    cols: usize,
}

impl CpuKernel for ForwardKernel<'_> {
    fn run<T: Float>(&self, args: &[&[T]]) -> Result<Vec<T>> {
        let (table, positions, cols) = (args[0], args[1], self.cols);
        check_ids("embed_tokens", self.ids, table.len() / cols)?;
        let seq = positions.len() / cols;
        let mut out = vec![T::ZERO; self.ids.len() * cols];
        out.par_chunks_mut(cols)
            .zip(self.ids)
            .enumerate()
            .for_each(|(i, (row, &id))| {
                let rows = table[id as usize * cols..].iter();
                let at = positions[(i % seq) * cols..].iter();
                for ((o, &e), &p) in row.iter_mut().zip(rows).zip(at) {
                    *o = e + p;
                }
            });
        Ok(out)
    }
}

impl CustomOp3 for EmbedTokens {
    fn name(&self) -> &'static str {
        "embed_tokens"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, cols) = l1.shape().dims2()?;
        let (b, t) = l3.shape().dims2()?;
        let kernel = ForwardKernel {
            ids: id_slice(self.name(), s3, l3)?,
            cols,
        };
        let args = [Arg::new(s1, l1, "table"), Arg::new(s2, l2, "positions")];
        let out = run_kernel(&kernel, self.name(), &args)?;
        Ok((out, (b, t, cols).into()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (_, cols) = l1.shape().dims2()?;
        let (b, t) = l3.shape().dims2()?;
        let out = super::embedding_cuda::forward((s1, l1), (s2, l2), (s3, l3))?;
        Ok((out, (b, t, cols).into()))
    }
}

/// `(dy [B, T, C], ids) -> d_table [vocab_rows, C]`.
struct TableGrad {
    vocab_rows: usize,
}

struct TableGradKernel<'a> {
    ids: &'a [u32],
    vocab_rows: usize,
    cols: usize,
}

impl CpuKernel for TableGradKernel<'_> {
    fn run<T: Float>(&self, args: &[&[T]]) -> Result<Vec<T>> {
        let (dy, ids, cols) = (args[0], self.ids, self.cols);
        check_ids("embed_tokens_backward", ids, self.vocab_rows)?;
        // Each id's tokens in token order (a counting sort): `order[starts[v]..starts[v + 1]]`.
        let mut starts = vec![0usize; self.vocab_rows + 1];
        for &id in ids {
            starts[id as usize + 1] += 1;
        }
        for v in 0..self.vocab_rows {
            starts[v + 1] += starts[v];
        }
        let mut next = starts.clone();
        let mut order = vec![0usize; ids.len()];
        for (i, &id) in ids.iter().enumerate() {
            order[next[id as usize]] = i;
            next[id as usize] += 1;
        }
        let mut out = vec![T::ZERO; self.vocab_rows * cols];
        out.par_chunks_mut(cols)
            .zip(starts.par_windows(2))
            .filter(|(_, range)| range[0] < range[1])
            .for_each(|(row, range)| {
                let mut sums = vec![0f64; cols];
                for &i in &order[range[0]..range[1]] {
                    for (s, g) in sums.iter_mut().zip(&dy[i * cols..(i + 1) * cols]) {
                        *s += g.to_f64();
                    }
                }
                for (o, s) in row.iter_mut().zip(sums) {
                    *o = T::from_f64(s);
                }
            });
        Ok(out)
    }
}

impl CustomOp2 for TableGrad {
    fn name(&self) -> &'static str {
        "embed_tokens_table_grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, _, cols) = l1.shape().dims3()?;
        let kernel = TableGradKernel {
            ids: id_slice(self.name(), s2, l2)?,
            vocab_rows: self.vocab_rows,
            cols,
        };
        let out = run_kernel(&kernel, self.name(), &[Arg::new(s1, l1, "dy")])?;
        Ok((out, (self.vocab_rows, cols).into()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (_, _, cols) = l1.shape().dims3()?;
        let out = super::embedding_cuda::table_grad((s1, l1), (s2, l2), self.vocab_rows)?;
        Ok((out, (self.vocab_rows, cols).into()))
    }
}

/// `dy [B, T, C] -> d_positions [position_rows, C]`.
struct PositionsGrad {
    position_rows: usize,
}

struct PositionsGradKernel {
    batch: usize,
    seq: usize,
    position_rows: usize,
    cols: usize,
}

impl CpuKernel for PositionsGradKernel {
    fn run<T: Float>(&self, args: &[&[T]]) -> Result<Vec<T>> {
        let (dy, cols, seq) = (args[0], self.cols, self.seq);
        let mut out = vec![T::ZERO; self.position_rows * cols];
        out[..seq * cols]
            .par_chunks_mut(cols)
            .enumerate()
            .for_each(|(t, row)| {
                for (c, o) in row.iter_mut().enumerate() {
                    let sum: f64 = (0..self.batch)
                        .map(|b| dy[(b * seq + t) * cols + c].to_f64())
                        .sum();
                    *o = T::from_f64(sum);
                }
            });
        Ok(out)
    }
}

impl CustomOp1 for PositionsGrad {
    fn name(&self) -> &'static str {
        "embed_tokens_positions_grad"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout) -> Result<(CpuStorage, Shape)> {
        let (batch, seq, cols) = l1.shape().dims3()?;
        let kernel = PositionsGradKernel {
            batch,
            seq,
            position_rows: self.position_rows,
            cols,
        };
        let out = run_kernel(&kernel, self.name(), &[Arg::new(s1, l1, "dy")])?;
        Ok((out, (self.position_rows, cols).into()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s1: &CudaStorage, l1: &Layout) -> Result<(CudaStorage, Shape)> {
        let (_, _, cols) = l1.shape().dims3()?;
        let out = super::embedding_cuda::positions_grad((s1, l1), self.position_rows)?;
        Ok((out, (self.position_rows, cols).into()))
    }
}

#[cfg(test)]
mod tests;
