//! What a training step minimises: an [`Objective`] turns the model's output and a batch's
//! targets into a mean loss and the metrics it reports (correct predictions for
//! classification; next-token cross-entropy reports none). The step knows nothing of the task.

use candle_core::Tensor;

use crate::error::Result;

/// A batch's loss and metrics.
pub struct LossOutput {
    /// Mean loss over the batch's samples: a scalar attached to the output's graph.
    pub loss: Tensor,
    /// Metrics summed over the batch's samples (e.g. `("correct", hits)`), detached scalars
    /// left on the device until the step's results are read.
    pub metrics: Vec<(&'static str, Tensor)>,
}

/// A loss function of the model output and the batch's targets.
pub trait Objective: Send + Sync {
    /// The batch's mean loss and summed metrics.
    fn loss(&self, output: &Tensor, targets: &Tensor) -> Result<LossOutput>;

    /// The batch's loss (detached) with the gradient of `scale × loss` with respect to
    /// `output` computed directly, when this objective can (no autograd graph over the output:
    /// a language model's logits are its largest tensor); `None` to back-propagate
    /// [`Objective::loss`] instead.
    fn loss_and_output_grad(
        &self,
        output: &Tensor,
        targets: &Tensor,
        scale: f64,
    ) -> Result<Option<(LossOutput, Tensor)>> {
        let _ = (output, targets, scale);
        Ok(None)
    }

    /// How many samples the mean loss averages over (rows of labels; tokens of a language
    /// model's targets): the weight of a micro-batch when losses are combined.
    fn samples(&self, targets: &Tensor) -> usize {
        targets.elem_count()
    }
}
