//! Reading the model between steps: every parameter whole on this rank (ZeRO-3 gathers them)
//! and the buffers synced over the ranks, for saving, loading or comparing it; and evaluating a
//! batch through the blocks' graph-free inference path.

use candle_core::Tensor;
use weft_tensor::tape;
use weft_tensor::{BlockModel, Mode};

use super::outcome::{outcome, BatchResult, StepTimings};
use super::Trainer;
use crate::error::Result;

/// The totals of evaluating one batch.
#[derive(Debug, Clone)]
pub struct EvalOutcome {
    /// The loss summed over the batch's samples.
    pub loss_sum: f64,
    pub samples: usize,
    /// The objective's metrics summed over the batch.
    pub metrics: Vec<(&'static str, f64)>,
}

impl Trainer {
    /// Runs `read` on the model with every parameter whole on this rank (ZeRO-3 gathers them
    /// first and releases them after, keeping what `read` wrote into them: FSDP's
    /// `summon_full_params` with write-back), e.g. to save, load or compare the model. A
    /// collective under ZeRO-3: every rank calls it.
    pub fn with_full_parameters<R>(
        &mut self,
        read: impl FnOnce(&BlockModel) -> Result<R>,
    ) -> Result<R> {
        self.gather_parameters()?;
        let result = read(&self.model);
        self.release_parameters()?;
        result
    }

    /// Makes every parameter whole on this rank until [`Self::release_parameters`] (ZeRO-3
    /// gathers them; a collective), and the buffers the same on every rank
    /// ([`Self::sync_buffers`]). [`Self::with_full_parameters`] pairs the two.
    pub fn gather_parameters(&mut self) -> Result<()> {
        self.sync_buffers()?;
        self.strategy.gather_parameters(&self.model)
    }

    /// Gives back what [`Self::gather_parameters`] gathered, keeping what was written into the
    /// parameters meanwhile (a collective under ZeRO-3).
    pub fn release_parameters(&mut self) -> Result<()> {
        self.strategy.release_parameters(&self.model)
    }

    /// The loss and metrics of one batch in evaluation mode, through the blocks' graph-free
    /// inference path (no autograd graph is kept), on buffers synced over the ranks
    /// ([`Self::sync_buffers`]: a collective after training steps).
    /// Under ZeRO-3 each block's parameters are gathered before it runs, and released after.
    /// A captured training step's memory goes back to the device first (see
    /// `StepGraph::release_for_eager_work`, with the `cuda` feature).
    pub fn evaluate(&mut self, inputs: &Tensor, targets: &Tensor) -> Result<EvalOutcome> {
        #[cfg(feature = "cuda")]
        if let Some(graph) = self.graph.as_mut() {
            graph.release_for_eager_work(inputs.device())?;
        }
        self.sync_buffers()?;
        let (model, strategy) = (&self.model, &mut self.strategy);
        let output = tape::infer_with(model, inputs, Mode::INFER, |block| {
            strategy.before_block_forward(model, block)
        })?;
        self.strategy.release_parameters(&self.model)?;
        let result = self.objective.loss(&output, targets)?;
        let samples = self.objective.samples(targets);
        let batch = BatchResult {
            loss: result.loss.detach(),
            metrics: result.metrics,
            samples,
        };
        let read = outcome(&[batch], StepTimings::default())?;
        Ok(EvalOutcome {
            loss_sum: read.loss * samples as f64,
            samples,
            metrics: read.metrics,
        })
    }
}
