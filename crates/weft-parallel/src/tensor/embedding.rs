//! The vocabulary-parallel token embedding (Megatron's `VocabParallelEmbedding`): each rank
//! holds a contiguous block of the table's rows. A lookup takes the rows this rank holds
//! (zeros for the others) and g sums them over the group; the tied head multiplies f(h) by the
//! local rows, giving this rank's block of the logits, which
//! [`super::vocab_parallel_cross_entropy`] consumes without ever gathering them.

use candle_core::{DType, Tensor, Var};
use weft_tensor::ops::project;
use weft_tensor::{EntryId, Scope};

use super::mappings::{copy_to_region, reduce_from_region};
use super::TensorParallelGroup;
use crate::error::{ParallelError, Result};

/// This rank's rows `[start, start + rows)` of the embedding table.
pub struct VocabParallelEmbedding {
    table: Var,
    id: EntryId,
    start: usize,
    group: TensorParallelGroup,
}

impl VocabParallelEmbedding {
    /// Registers this rank's block of `table` (`[vocab rows, width]`, rows divisible by the
    /// group's size) as `weight` in `scope`.
    pub fn from_full(
        scope: &mut Scope,
        table: &Tensor,
        group: &TensorParallelGroup,
    ) -> Result<Self> {
        let rows = table.dim(0)?;
        if !rows.is_multiple_of(group.size()) {
            return Err(ParallelError::Config(format!(
                "{rows} embedding rows do not split over {} ranks",
                group.size()
            )));
        }
        let per_rank = rows / group.size();
        let start = group.rank() * per_rank;
        let id = scope.store_len();
        let local = table.narrow(0, start, per_rank)?.contiguous()?;
        Ok(Self {
            table: scope.parameter("weight", local)?,
            id,
            start,
            group: group.clone(),
        })
    }

    /// The first row this rank holds.
    pub fn start(&self) -> usize {
        self.start
    }

    pub fn table_id(&self) -> EntryId {
        self.id
    }

    /// This rank's rows of the table, `[rows / size, width]`.
    pub fn table(&self) -> &Tensor {
        self.table.as_tensor()
    }

    pub fn group(&self) -> &TensorParallelGroup {
        &self.group
    }

    /// `[B, T]` u32 ids to `[B, T, width]` vectors.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let table = self.table.as_tensor();
        let rows = table.dim(0)? as i64;
        let (b, t) = ids.dims2()?;
        let local = (ids.flatten_all()?.to_dtype(DType::I64)? - self.start as f64)?;
        let held = local.ge(0i64)?.mul(&local.lt(rows)?)?;
        let index = held
            .where_cond(&local, &local.zeros_like()?)?
            .to_dtype(DType::U32)?;
        let found = table.embedding(&index)?;
        let mask = held.to_dtype(table.dtype())?.unsqueeze(1)?;
        let partial = found.broadcast_mul(&mask)?.reshape((b, t, table.dim(1)?))?;
        reduce_from_region(&partial, &self.group)
    }

    /// `[B, T, width]` hidden states to this rank's block of the logits, `[B, T, rows]`.
    pub fn logits(&self, h: &Tensor) -> Result<Tensor> {
        let h = copy_to_region(h, &self.group)?;
        Ok(project(&h, &self.table.as_tensor().t()?)?)
    }
}
