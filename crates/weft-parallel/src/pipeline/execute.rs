//! [`PipelineTrainer`]: one pipeline stage's training step, executing its part of a [`Plan`]
//! action by action. A forward runs the stage's blocks on the micro-batch's input (the batch
//! itself on the first stage, the previous stage's activation elsewhere) and keeps the tape;
//! the last stage scores it with the objective. A backward starts from the loss (last stage)
//! or from the gradient the next stage sent, accumulates parameter gradients into the flat
//! buffer, and yields the gradient of the stage's input to send back. After the plan, the
//! stage's trainer takes the update: its strategy ([`super::PipelineStage`]) syncs gradients
//! within the stage and the tied table between the ends, and reduces the gradient norm and the
//! found-inf flag over all stages, so every stage steps (or skips) together.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{DType, Shape, Tensor};
use weft_collectives::Communicator;
use weft_tensor::tape::{Seed, Tape};

use super::links::StageLinks;
use super::schedule::{theoretical_bubble, Plan, ScheduleKind};
use super::Action;
use crate::collectives::TensorCollectives;
use crate::error::{ParallelError, Result};
use crate::step::{outcome, BatchResult, StepOutcome, StepTimings, Trainer};

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

/// A micro-batch between its forward and its backward.
struct InFlight {
    tape: Tape,
    /// What the tape keeps for backward.
    bytes: usize,
    /// The loss to back-propagate (last stage only).
    loss: Option<Tensor>,
    output_shape: Shape,
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
        self.trainer.report_scaling(&mut step);
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

    /// Time since `start` of a forward or backward, once the device has run it: the bubble is
    /// the device's idle time, not the host's (on a GPU this costs the host's running ahead by
    /// one action; on the CPU nothing).
    fn compute_time(&self, start: Instant) -> Result<Duration> {
        self.trainer.model().store().device().synchronize()?;
        Ok(start.elapsed())
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

    /// Runs this stage's actions of `plan`: the micro-batches' results (last stage) and what
    /// the schedule measured.
    fn run_plan(
        &mut self,
        plan: &Plan,
        inputs: &[Tensor],
        targets: &[Tensor],
        timings: &mut StepTimings,
    ) -> Result<(Vec<BatchResult>, Measured)> {
        let model = self.trainer.model();
        let (dtype, device) = (model.store().dtype(), model.store().device().clone());
        let objective = self.trainer.objective();
        let total: usize = targets.iter().map(|t| objective.samples(t)).sum();
        let (first, last) = (self.is_first(), self.is_last());
        let mut received: HashMap<usize, Tensor> = HashMap::new();
        let mut in_flight: HashMap<usize, InFlight> = HashMap::new();
        let mut outputs: HashMap<usize, Tensor> = HashMap::new();
        let mut output_grads: HashMap<usize, Tensor> = HashMap::new();
        let mut input_grads: HashMap<usize, Tensor> = HashMap::new();
        let mut results: Vec<(usize, BatchResult)> = Vec::new();
        let mut measured = Measured::default();
        let (mut backwards, started) = (0, Instant::now());
        let stage = self.stage();
        for &action in &plan.actions[stage] {
            let missing = |what: &str, i: usize| {
                ParallelError::Config(format!(
                    "stage {stage}: {action:?} before micro-batch {i}'s {what}"
                ))
            };
            match action {
                Action::RecvActivation(i) => {
                    received.insert(i, self.links.recv_activation(dtype, &device)?);
                }
                Action::Forward(i) => {
                    let start = Instant::now();
                    let x = match first {
                        true => inputs[i].clone(),
                        false => received
                            .remove(&i)
                            .ok_or_else(|| missing("activation", i))?,
                    };
                    self.trainer.strategy_before_forward()?;
                    let tape = self.trainer.forward_tape(&x, i, !first)?;
                    let output_shape = tape.output().shape().clone();
                    let loss = match last {
                        true => {
                            let weight = self.trainer.objective().samples(&targets[i]) as f64
                                / total.max(1) as f64;
                            let (result, scaled) =
                                self.trainer.weighted_loss(&tape, &targets[i], weight)?;
                            results.push((i, result));
                            Some(scaled)
                        }
                        false => {
                            outputs.insert(i, tape.output().clone());
                            None
                        }
                    };
                    let bytes = tape.saved_activation_bytes();
                    in_flight.insert(
                        i,
                        InFlight {
                            tape,
                            bytes,
                            loss,
                            output_shape,
                        },
                    );
                    let held: usize = in_flight.values().map(|f| f.bytes).sum();
                    measured.peak_in_flight = measured.peak_in_flight.max(in_flight.len());
                    measured.peak_activation_bytes = measured.peak_activation_bytes.max(held);
                    let spent = self.compute_time(start)?;
                    timings.forward += spent;
                    measured.compute += spent;
                }
                Action::SendActivation(i) => {
                    let output = outputs.remove(&i).ok_or_else(|| missing("output", i))?;
                    self.links.send_activation(&output)?;
                }
                Action::RecvGrad(i) => {
                    let shape = &in_flight
                        .get(&i)
                        .ok_or_else(|| missing("forward", i))?
                        .output_shape;
                    output_grads.insert(i, self.links.recv_grad(shape, dtype, &device)?);
                }
                Action::Backward(i) => {
                    let start = Instant::now();
                    let state = in_flight.remove(&i).ok_or_else(|| missing("forward", i))?;
                    let received = output_grads.remove(&i);
                    let seed = match (&state.loss, &received) {
                        (Some(loss), _) => Seed::Loss(loss),
                        (None, Some(grad)) => Seed::OutputGrad(grad),
                        (None, None) => return Err(missing("output gradient", i)),
                    };
                    self.trainer
                        .set_require_sync(backwards + 1 == plan.microbatches);
                    let grad = self
                        .trainer
                        .backward_tape(state.tape, seed, backwards > 0)?;
                    backwards += 1;
                    if let (false, Some(grad)) = (first, grad) {
                        input_grads.insert(i, grad);
                    }
                    let spent = self.compute_time(start)?;
                    timings.backward += spent;
                    measured.compute += spent;
                }
                Action::SendGrad(i) => {
                    let grad = input_grads
                        .remove(&i)
                        .ok_or_else(|| missing("input gradient", i))?;
                    self.links.send_grad(&grad)?;
                }
            }
        }
        measured.wall = started.elapsed();
        self.links.finish()?;
        results.sort_by_key(|(i, _)| *i);
        Ok((results.into_iter().map(|(_, r)| r).collect(), measured))
    }
}

/// What a stage's part of a schedule measured.
#[derive(Debug, Default)]
struct Measured {
    /// Time in the stage's forwards and backwards.
    compute: Duration,
    /// From the first action to the last.
    wall: Duration,
    peak_in_flight: usize,
    peak_activation_bytes: usize,
}

impl Measured {
    fn bubble(&self) -> f64 {
        let wall = self.wall.as_secs_f64();
        match wall > 0.0 {
            true => (1.0 - self.compute.as_secs_f64() / wall).max(0.0),
            false => 0.0,
        }
    }
}
