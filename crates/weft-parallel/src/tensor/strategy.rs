//! [`TensorParallel`]: the strategy of a tensor-parallel rank, wrapping the data-parallel
//! strategy of its replica. Gradients need no communication over the tensor-parallel group
//! (each rank's slices are its own, and the whole parameters — LayerNorms, the biases after a
//! reduction, the position table — get equal gradients on every rank, since f and g sum the
//! partial results). What the group must agree on is the step itself: the global gradient norm
//! (slices summed over the group, whole parameters counted once) and whether any rank found an
//! inf or NaN (the maximum over the group).

use std::ops::Range;

use candle_core::Tensor;
use weft_tensor::FlatBuffer;

use super::TensorParallelGroup;
use crate::error::Result;
use crate::strategy::{ReadyGrads, Strategy};

/// A data-parallel strategy (`inner`) inside a tensor-parallel group.
pub struct TensorParallel {
    inner: Box<dyn Strategy>,
    group: TensorParallelGroup,
    /// Elements of the flat buffers that every rank of the group holds whole.
    replicated: Vec<Range<usize>>,
}

impl TensorParallel {
    /// `inner` over the replicas, in `group`; `replicated` the flat-buffer ranges of the
    /// parameters each rank of the group holds whole.
    pub fn new(
        inner: Box<dyn Strategy>,
        group: TensorParallelGroup,
        replicated: Vec<Range<usize>>,
    ) -> Self {
        Self {
            inner,
            group,
            replicated: merge_adjacent(replicated),
        }
    }
}

/// `ranges` sorted, with neighbours that touch joined (a LayerNorm's weight and bias are one
/// range): fewer sums per step.
fn merge_adjacent(mut ranges: Vec<Range<usize>>) -> Vec<Range<usize>> {
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match merged.last_mut() {
            Some(last) if last.end == r.start => last.end = r.end,
            _ => merged.push(r),
        }
    }
    merged
}

impl Strategy for TensorParallel {
    fn name(&self) -> &'static str {
        "tensor-parallel"
    }

    fn wrapped(&self) -> Option<&dyn Strategy> {
        Some(self.inner.as_ref())
    }

    fn wrapped_mut(&mut self) -> Option<&mut dyn Strategy> {
        Some(self.inner.as_mut())
    }

    fn block_ready(&mut self, ready: &ReadyGrads, grads: &FlatBuffer) -> Result<()> {
        self.inner.block_ready(ready, grads)
    }

    fn finish_backward(&mut self, grads: &FlatBuffer) -> Result<()> {
        self.inner.finish_backward(grads)
    }

    fn set_require_sync(&mut self, sync: bool) {
        self.inner.set_require_sync(sync)
    }

    /// The sum of the squares, the whole parameters' weighed `1 / size` (the group's sum then
    /// counts them once).
    fn local_grad_norm_squared(&self, squares: &Tensor, range: Range<usize>) -> Result<Tensor> {
        let total = self.inner.local_grad_norm_squared(squares, range.clone())?;
        let mut whole = Vec::new();
        for r in &self.replicated {
            let (start, end) = (r.start.max(range.start), r.end.min(range.end));
            if start < end {
                whole.push(
                    squares
                        .narrow(0, start - range.start, end - start)?
                        .sum_all()?,
                );
            }
        }
        if whole.is_empty() {
            return Ok(total);
        }
        let share = 1.0 - 1.0 / self.group.size() as f64;
        let whole = Tensor::stack(&whole, 0)?.sum_all()?;
        Ok((total - (whole * share)?)?)
    }

    fn reduce_grad_norm_squared(&mut self, local: Tensor) -> Result<Tensor> {
        let over_group = self.group.all_reduce(&local)?;
        self.inner.reduce_grad_norm_squared(over_group)
    }

    fn reduce_found_inf(&mut self, local: Tensor) -> Result<Tensor> {
        let over_group = self.group.all_reduce_max(&local)?;
        self.inner.reduce_found_inf(over_group)
    }

    fn capturable(&self) -> bool {
        false
    }
}
