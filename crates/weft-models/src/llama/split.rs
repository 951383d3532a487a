//! How a Llama-family model is split over the ranks of a tensor-parallel group, as the model
//! sees it: Megatron's plan for each weight ([`Cut`]: q, k, v, gate and up by output rows —
//! attention by heads —, o and down by input columns, the token table and the head by
//! vocabulary rows) and the sums over the ranks that join the parts. The model stays free of
//! parallelism: a trainer's `parallelize` step implements [`LlamaSplit`] with its group, and
//! without one every weight is whole.
//!
//! Weights are `nn.Linear`'s `[out, in]`, so a column-parallel projection (Megatron's
//! language) keeps a block of the tensor's rows and a row-parallel one a block of its columns.

use std::sync::Arc;

use candle_core::{DType, Tensor, Var};
use weft_tensor::{Result, Scope};

use crate::gpt::lookup;

/// Which part of a full weight a rank keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut<'a> {
    /// Output rows: the rows form groups of these sizes (the fused q | k | v, gate | up), each
    /// group cut into equal blocks, this rank's blocks kept in group order.
    Rows(&'a [usize]),
    /// Input columns: an equal block of the columns.
    Columns,
}

/// A tensor-parallel group as the model uses it.
pub trait LlamaSplit: Send + Sync {
    /// This rank's place in the group.
    fn rank(&self) -> usize;
    /// The number of ranks the weights are split over.
    fn size(&self) -> usize;
    /// Registers this rank's part of `full` as `name` in `scope`, cut as `cut`.
    fn parameter(&self, scope: &mut Scope, name: &str, full: Tensor, cut: Cut) -> Result<Var>;
    /// The sum of `x` over the ranks, outside any graph (the blocks' own backward).
    fn sum(&self, x: &Tensor) -> Result<Tensor>;
    /// Megatron's f in Candle's graph: `x` forward, the gradient summed over the ranks backward.
    fn enter(&self, x: &Tensor) -> Result<Tensor>;
    /// Megatron's g in Candle's graph: the sum over the ranks forward, the gradient as it is
    /// backward.
    fn reduce(&self, x: &Tensor) -> Result<Tensor>;
}

/// The split a model's blocks share: `None` for a whole model.
pub(super) type Split = Option<Arc<dyn LlamaSplit>>;

/// Registers `full` as `name` in `scope`: whole, or this rank's part as `split` cuts it.
pub(super) fn parameter(
    split: &Split,
    scope: &mut Scope,
    name: &str,
    full: Tensor,
    cut: Cut,
) -> Result<Var> {
    match split {
        Some(split) => split.parameter(scope, name, full, cut),
        None => scope.parameter(name, full),
    }
}

/// The block of `rows` vocabulary rows this rank's table holds starts at this id.
pub(super) fn vocab_start(split: &dyn LlamaSplit, rows: usize) -> usize {
    split.rank() * rows
}

/// Ids `[B, T]` as rows of a table block of `rows` rows starting at `start`: the row of each
/// id the block holds, `other` for the others (as u32), and which ids it holds (as `dtype`
/// ones and zeros, `[B·T, 1]`).
pub(super) fn local_ids(
    ids: &Tensor,
    start: usize,
    rows: usize,
    other: u32,
    dtype: DType,
) -> Result<(Tensor, Tensor)> {
    let local = (ids.flatten_all()?.to_dtype(DType::I64)? - start as f64)?;
    let held = local.ge(0i64)?.mul(&local.lt(rows as i64)?)?;
    let fallback = Tensor::full(i64::from(other), local.shape(), local.device())?;
    let index = held.where_cond(&local, &fallback)?.to_dtype(DType::U32)?;
    let (b, t) = ids.dims2()?;
    let index = index.reshape((b, t))?;
    Ok((index, held.to_dtype(dtype)?.unsqueeze(1)?))
}

/// The rows of `table` (this rank's block, starting at id `start`) for `ids`, zeros for the
/// ids other ranks hold: this rank's term of the lookup's sum over the group.
pub(super) fn partial_lookup(table: &Tensor, ids: &Tensor, start: usize) -> Result<Tensor> {
    let (b, t) = ids.dims2()?;
    let (index, held) = local_ids(ids, start, table.dim(0)?, 0, table.dtype())?;
    let rows = lookup(table, &index)?.reshape((b * t, ()))?;
    Ok(rows.broadcast_mul(&held)?.reshape((b, t, ()))?)
}

/// `x` entering a split part in Candle's graph (f); `x` itself for a whole model.
pub(super) fn enter(split: &Split, x: Tensor) -> Result<Tensor> {
    match split {
        Some(split) => split.enter(&x),
        None => Ok(x),
    }
}

/// A split part's term summed over the ranks in Candle's graph (g); `x` for a whole model.
pub(super) fn reduce(split: &Split, x: Tensor) -> Result<Tensor> {
    match split {
        Some(split) => split.reduce(&x),
        None => Ok(x),
    }
}

/// A split part's term summed over the ranks outside any graph; `x` for a whole model.
pub(super) fn sum(split: &Split, x: Tensor) -> Result<Tensor> {
    match split {
        Some(split) => split.sum(&x),
        None => Ok(x),
    }
}
