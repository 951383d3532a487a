//! [`PipelineStage`]: the strategy of one pipeline stage, wrapping the strategy of its own
//! blocks (data and tensor parallelism inside the stage). The stages hold different
//! parameters, so their gradients need no reduction across stages, except the token table
//! that the first stage embeds with and the last stage's head multiplies by: each holds a copy,
//! and their gradients are summed between the two before the update, so that both copies take
//! the same step and stay equal (Megatron's embedding group). What all stages must agree on is
//! the step itself: the global gradient norm (summed over stages, the table counted once) and
//! whether any stage found an inf or NaN.

use std::ops::Range;
use std::sync::Arc;

use candle_core::Tensor;
use weft_collectives::{Communicator, ReduceOp};
use weft_tensor::FlatBuffer;

use crate::collectives::TensorCollectives;
use crate::error::{ParallelError, Result};
use crate::strategy::{ReadyGrads, Strategy};

/// The token table's copy on this stage and the group of the stages holding one.
struct TiedTable {
    /// The first and last stage.
    group: Arc<dyn Communicator>,
    /// The table's elements in the flat buffers.
    range: Range<usize>,
    /// Whether this stage's copy counts in the gradient norm (the first stage's).
    counted: bool,
}

/// One stage's strategy: `inner` for its own blocks, the stages joined over `stages`.
pub struct PipelineStage {
    inner: Box<dyn Strategy>,
    stages: Arc<dyn Communicator>,
    tied: Option<TiedTable>,
}

impl PipelineStage {
    /// `inner` on this stage (rank `stages.rank()` on the pipeline axis `stages`); `tied` the
    /// flat-buffer range of the token table on the first and last stage (`None` elsewhere, and
    /// on both for a model without tied weights). `inner` must leave the table's whole
    /// gradient reduced after `finish_backward` (DDP and ZeRO-1 do; ZeRO-2 keeps only its
    /// shard). A collective: every stage calls it.
    pub fn new(
        inner: Box<dyn Strategy>,
        stages: Arc<dyn Communicator>,
        tied: Option<Range<usize>>,
    ) -> Result<Self> {
        let (stage, count) = (stages.rank(), stages.world_size());
        let group: Arc<dyn Communicator> =
            Arc::from(stages.split(u32::from(tied.is_none()), stage as i64)?);
        let tied = match tied {
            Some(_) if count == 1 => None,
            Some(range) => {
                if group.world_size() != 2 {
                    return Err(ParallelError::Config(format!(
                        "stage {stage}: the tied token table is held by {} stages, not by the first and last",
                        group.world_size()
                    )));
                }
                Some(TiedTable {
                    group,
                    range,
                    counted: stage == 0,
                })
            }
            None => None,
        };
        Ok(Self {
            inner,
            stages,
            tied,
        })
    }

    /// Sums the table's gradient with the other end's copy's.
    fn sum_tied_gradients(&self, grads: &FlatBuffer) -> Result<()> {
        let Some(tied) = &self.tied else {
            return Ok(());
        };
        let range = tied.range.clone();
        let local = grads.range(&range)?;
        let sum = tied
            .group
            .all_reduce_tensor(&local, ReduceOp::Sum)?
            .wait()?;
        local.slice_set(&sum, 0, 0)?;
        Ok(())
    }
}

impl Strategy for PipelineStage {
    fn name(&self) -> &'static str {
        "pipeline"
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
        self.inner.finish_backward(grads)?;
        self.sum_tied_gradients(grads)
    }

    fn set_require_sync(&mut self, sync: bool) {
        self.inner.set_require_sync(sync)
    }

    /// The inner strategy's share, less its share of the last stage's copy of the table.
    fn local_grad_norm_squared(&self, squares: &Tensor, range: Range<usize>) -> Result<Tensor> {
        let total = self.inner.local_grad_norm_squared(squares, range.clone())?;
        let Some(tied) = self.tied.as_ref().filter(|t| !t.counted) else {
            return Ok(total);
        };
        let (start, end) = (
            tied.range.start.max(range.start),
            tied.range.end.min(range.end),
        );
        if start >= end {
            return Ok(total);
        }
        let copy = squares.narrow(0, start - range.start, end - start)?;
        let copy = self.inner.local_grad_norm_squared(&copy, start..end)?;
        Ok((total - copy)?)
    }

    fn reduce_grad_norm_squared(&mut self, local: Tensor) -> Result<Tensor> {
        let within = self.inner.reduce_grad_norm_squared(local)?;
        self.stages
            .all_reduce_tensor(&within, ReduceOp::Sum)?
            .wait()
    }

    fn reduce_found_inf(&mut self, local: Tensor) -> Result<Tensor> {
        let within = self.inner.reduce_found_inf(local)?;
        self.stages
            .all_reduce_tensor(&within, ReduceOp::Max)?
            .wait()
    }

    /// A pipeline's sends and receives wait on the host.
    fn capturable(&self) -> bool {
        false
    }
}
