//! [`PipelineTrainer`]: one pipeline stage's training step, executing its part of a [`Plan`]
//! action by action. A forward runs the stage's blocks on the micro-batch's input (the batch
//! itself on the first stage, the previous stage's activation elsewhere) and keeps the tape;
//! the last stage scores it with the objective. A backward starts from the loss (last stage)
//! or from the gradient the next stage sent, accumulates parameter gradients into the flat
//! buffer, and yields the gradient of the stage's input to send back. After the plan, the
//! stage's trainer takes the update: its strategy ([`super::PipelineStage`]) syncs gradients
//! within the stage and the tied table between the ends, and reduces the gradient norm and the
//! found-inf flag over all stages, so every stage steps (or skips) together.

use std::sync::Arc;

use candle_core::{DType, Tensor};
use weft_collectives::Communicator;

use super::links::StageLinks;
use super::schedule::{theoretical_bubble, Plan, ScheduleKind};
use crate::collectives::TensorCollectives;
use crate::error::{ParallelError, Result};
use crate::step::{outcome, StepOutcome, StepTimings, Trainer};

/// A stage's trainer, its links to the neighbouring stages and the schedule it follows.
pub struct PipelineTrainer {
    pub(super) trainer: Trainer,
    pub(super) links: StageLinks,
    pub(super) stages: Arc<dyn Communicator>,
    schedule: ScheduleKind,
    micro_batches: usize,
}

/// What one pipeline step measured on this stage.
#[derive(Debug, Clone)]
pub struct PipelineStepOutcome {
    /// The step: its loss is the last stage's (every stage reports it), its metrics this
    /// stage's (`grad_norm` with clipping, the same on every stage).
    pub step: StepOutcome,
    pub stage: usize,
    /// The part of the schedule's wall time this stage computed nothing (waiting for its
    /// neighbours, or for data between them).
    pub bubble: f64,
    /// `(P − 1) / (M + P − 1)`, the bubble of equal stages with free communication.
    pub theoretical_bubble: f64,
    /// The most micro-batches whose activations this stage held at once.
    pub peak_in_flight: usize,
    /// The most bytes of activations this stage held at once for its backwards (what the
    /// tapes of the micro-batches in flight keep).
    pub peak_activation_bytes: usize,
}

impl PipelineTrainer {
    /// This stage's `trainer` (its model the stage's blocks, its strategy a
    /// [`super::PipelineStage`]) on the pipeline axis `stages` (this rank's stage is
    /// `stages.rank()`), following `schedule` over `micro_batches` micro-batches per step.
    /// A collective: every stage calls it.
    pub fn new(
        trainer: Trainer,
        stages: Arc<dyn Communicator>,
        schedule: ScheduleKind,
        micro_batches: usize,
    ) -> Result<Self> {
        if micro_batches == 0 || schedule == ScheduleKind::ForwardOnly {
            return Err(ParallelError::Config(format!(
                "a training pipeline needs a GPipe or 1F1B schedule over at least one micro-batch, not {schedule:?} over {micro_batches}"
            )));
        }
        let links = StageLinks::new(stages.as_ref())?;
        Ok(Self {
            trainer,
            links,
            stages,
            schedule,
            micro_batches,
        })
    }

    pub fn trainer(&self) -> &Trainer {
        &self.trainer
    }

    pub fn trainer_mut(&mut self) -> &mut Trainer {
        &mut self.trainer
    }

    /// The pipeline axis: this stage and the others.
    pub fn pipeline(&self) -> &Arc<dyn Communicator> {
        &self.stages
    }

    pub fn stage(&self) -> usize {
        self.links.stage()
    }

    pub fn is_first(&self) -> bool {
        self.links.stage() == 0
    }

    pub fn is_last(&self) -> bool {
        self.links.stage() + 1 == self.links.stages()
    }

    /// The plan this stage follows each step.
    pub fn plan(&self) -> Plan {
        Plan::new(self.schedule, self.links.stages(), self.micro_batches)
    }

    /// One step with learning rate `lr`: the first stage gives `inputs`, the last `targets`
    /// (others may give `None`), each split along the first dimension into the micro-batches.
    pub fn step(
        &mut self,
        inputs: Option<&Tensor>,
        targets: Option<&Tensor>,
        lr: f64,
    ) -> Result<PipelineStepOutcome> {
        self.trainer.set_lr(lr)?;
        self.trainer.prepare()?;
        let m = self.micro_batches;
        let inputs = self.split("inputs", inputs, self.is_first(), m)?;
        let targets = self.split("targets", targets, self.is_last(), m)?;
        let plan = self.plan();
        let mut timings = StepTimings::default();
        let (results, measured) = self.run_plan(&plan, &inputs, &targets, &mut timings)?;
        let norm = self.trainer.update(&mut timings)?;
        self.trainer.wait_for_device()?;
        let mut step = outcome(&results, timings)?;
        if let Some(norm) = norm {
            let norm = norm.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?[0];
            step.metrics.push(("grad_norm", norm));
        }
        self.trainer.report_scaling(&mut step)?;
        let (loss_sum, samples) =
            self.last_stage_sums(step.loss * step.samples as f64, step.samples)?;
        step.loss = loss_sum / samples.max(1) as f64;
        step.samples = samples;
        let stage = self.stage();
        Ok(PipelineStepOutcome {
            step,
            stage,
            bubble: measured.bubble(),
            theoretical_bubble: theoretical_bubble(plan.stages, plan.microbatches),
            peak_in_flight: measured.peak_in_flight,
            peak_activation_bytes: measured.peak_activation_bytes,
        })
    }

    /// `batch` cut into `m` micro-batches, where this stage `needs` it.
    pub(super) fn split(
        &self,
        what: &str,
        batch: Option<&Tensor>,
        needs: bool,
        m: usize,
    ) -> Result<Vec<Tensor>> {
        let stage = self.stage();
        let Some(batch) = batch.filter(|_| needs) else {
            return match needs {
                true => Err(ParallelError::Config(format!(
                    "stage {stage} needs the batch's {what}"
                ))),
                false => Ok(Vec::new()),
            };
        };
        let rows = batch.dim(0)?;
        if !rows.is_multiple_of(m) {
            return Err(ParallelError::Config(format!(
                "stage {stage}: a batch of {rows} samples cannot be split into {m} micro-batches"
            )));
        }
        let per = rows / m;
        (0..m).map(|i| Ok(batch.narrow(0, i * per, per)?)).collect()
    }

    /// `(sum, count)` as the last stage has them, on every stage.
    pub(super) fn last_stage_sums(&self, sum: f64, count: usize) -> Result<(f64, usize)> {
        let root = self.links.stages() - 1;
        let local = Tensor::new(&[sum, count as f64], &candle_core::Device::Cpu)?;
        let values = self
            .stages
            .broadcast_tensor(&local, root)?
            .wait()?
            .to_vec1::<f64>()?;
        Ok((values[0], values[1] as usize))
    }
}
