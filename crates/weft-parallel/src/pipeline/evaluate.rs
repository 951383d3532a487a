//! Evaluation through a pipeline: the forward-only plan, each stage running its blocks'
//! graph-free inference on each micro-batch and passing the activation on; the last stage
//! scores it, and every stage reports the last stage's sums.

use std::collections::HashMap;

use candle_core::Tensor;
use weft_tensor::{tape, Mode};

use super::execute::PipelineTrainer;
use super::schedule::{Plan, ScheduleKind};
use super::Action;
use crate::error::{ParallelError, Result};
use crate::step::{outcome, BatchResult, EvalOutcome, StepTimings};

impl PipelineTrainer {
    /// The loss of one batch in evaluation mode: the first stage gives `inputs`, the last
    /// `targets` (split into the step's micro-batches). Every stage returns the batch's loss
    /// sum and samples; the objective's metrics only on the last stage.
    pub fn evaluate(
        &mut self,
        inputs: Option<&Tensor>,
        targets: Option<&Tensor>,
    ) -> Result<EvalOutcome> {
        let m = self.plan().microbatches;
        self.evaluate_in(inputs, targets, m)
    }

    /// [`Self::evaluate`] in `micro_batches` micro-batches (every stage must pass the same
    /// number).
    pub fn evaluate_in(
        &mut self,
        inputs: Option<&Tensor>,
        targets: Option<&Tensor>,
        micro_batches: usize,
    ) -> Result<EvalOutcome> {
        let m = micro_batches.max(1);
        let inputs = self.split("inputs", inputs, self.is_first(), m)?;
        let targets = self.split("targets", targets, self.is_last(), m)?;
        let stage = self.stage();
        let plan = Plan::new(ScheduleKind::ForwardOnly, self.links.stages(), m);
        // The stage's buffers, synced over its data-parallel replicas after training.
        self.trainer.sync_buffers()?;
        let model = self.trainer.model();
        let (dtype, device) = (model.store().dtype(), model.store().device().clone());
        let mut received: HashMap<usize, Tensor> = HashMap::new();
        let mut outputs: HashMap<usize, Tensor> = HashMap::new();
        let mut scored: Vec<BatchResult> = Vec::new();
        self.links.begin_step();
        for &action in &plan.actions[stage] {
            let missing =
                || ParallelError::Config(format!("stage {stage}: {action:?} before its input"));
            match action {
                Action::RecvActivation(i) => {
                    received.insert(i, self.links.recv_activation(dtype, &device)?);
                }
                Action::Forward(i) => {
                    let x = match self.is_first() {
                        true => inputs[i].clone(),
                        false => received.remove(&i).ok_or_else(missing)?,
                    };
                    let output = tape::infer(self.trainer.model(), &x, Mode::INFER)?;
                    if !self.is_last() {
                        outputs.insert(i, output);
                        continue;
                    }
                    let objective = self.trainer.objective();
                    let result = objective.loss(&output, &targets[i])?;
                    scored.push(BatchResult {
                        loss: result.loss,
                        metrics: result.metrics,
                        samples: objective.samples(&targets[i]),
                    });
                }
                Action::SendActivation(i) => {
                    let output = outputs.remove(&i).ok_or_else(missing)?;
                    self.links.send_activation(&output)?;
                }
                other => {
                    return Err(ParallelError::Config(format!(
                        "stage {stage}: {other:?} in a forward-only plan"
                    )))
                }
            }
        }
        self.links.finish()?;
        let read = outcome(&scored, StepTimings::default())?;
        let loss_sum = read.loss * read.samples as f64;
        let (loss_sum, samples) = self.last_stage_sums(loss_sum, read.samples)?;
        Ok(EvalOutcome {
            loss_sum,
            samples,
            metrics: read.metrics,
        })
    }
}
