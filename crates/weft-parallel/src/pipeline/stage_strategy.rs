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
use weft_tensor::{BlockModel, FlatBuffer, Slot};

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

    fn before_forward(&mut self, model: &BlockModel) -> Result<()> {
        self.inner.before_forward(model)
    }

    fn before_block_forward(&mut self, model: &BlockModel, block: usize) -> Result<()> {
        self.inner.before_block_forward(model, block)
    }

    fn before_block_backward(&mut self, model: &BlockModel, block: usize) -> Result<()> {
        self.inner.before_block_backward(model, block)
    }

    fn gradient_window(&self, len: usize) -> Range<usize> {
        self.inner.gradient_window(len)
    }

    fn stage_gradients(&mut self, grads: &[(&Slot, Tensor)]) -> Result<bool> {
        self.inner.stage_gradients(grads)
    }

    fn take_communication_peak(&mut self) -> usize {
        self.inner.take_communication_peak()
    }

    fn before_update(&mut self, model: &BlockModel) -> Result<()> {
        self.inner.before_update(model)
    }

    fn gather_parameters(&mut self, model: &BlockModel) -> Result<()> {
        self.inner.gather_parameters(model)
    }

    fn release_parameters(&mut self, model: &BlockModel) -> Result<()> {
        self.inner.release_parameters(model)
    }

    fn parameter_shard(&self) -> Option<&Tensor> {
        self.inner.parameter_shard()
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

    fn optimizer_range(&self, len: usize) -> Range<usize> {
        self.inner.optimizer_range(len)
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

    fn after_step(&mut self, model: &BlockModel) -> Result<()> {
        self.inner.after_step(model)
    }

    fn wait_for_device(&mut self) -> Result<()> {
        self.inner.wait_for_device()
    }
}
