//! One training step as the loop sees it: the whole model's, through its [`Trainer`] (replayed
//! from a CUDA graph where the step was captured, launched before the step before it is read),
//! or one pipeline stage's, through its [`PipelineTrainer`] (each step run to completion: the
//! stages' schedule is a sequence of collectives), with every stage's measurements gathered.

use anyhow::{bail, Result};
use candle_core::Tensor;
use weft_collectives::Buffer;
use weft_parallel::pipeline::PipelineTrainer;
use weft_parallel::{EvalOutcome, LaunchedStep, StepOutcome, Trainer};
use weft_tensor::BlockModel;

use super::metrics::PipelineReport;

/// A training step of the whole model (micro-batches accumulated) or of one pipeline stage.
pub enum Stepper {
    Whole(Trainer),
    Stage(PipelineTrainer),
}

/// A step handed to the device by [`Stepper::launch_then`], read by [`Stepper::finish`].
pub enum Launched {
    Whole(LaunchedStep),
    /// A pipeline step, run to completion.
    Stage(StepOutcome, PipelineReport),
}

impl Launched {
    /// Whether the step may still be running on the device (a queued replay).
    pub fn is_queued(&self) -> bool {
        matches!(self, Launched::Whole(step) if step.is_queued())
    }
}

impl Stepper {
    pub fn model(&self) -> &BlockModel {
        match self {
            Stepper::Whole(t) => t.model(),
            Stepper::Stage(p) => p.trainer().model(),
        }
    }

    /// This rank's trainer (its stage's, with a pipeline).
    pub fn trainer_mut(&mut self) -> &mut Trainer {
        match self {
            Stepper::Whole(t) => t,
            Stepper::Stage(p) => p.trainer_mut(),
        }
    }

    /// Whether this rank reads batches: every rank without a pipeline, the first stage (the
    /// inputs) and the last (the targets) with one.
    pub fn reads_batches(&self) -> bool {
        match self {
            Stepper::Whole(_) => true,
            Stepper::Stage(p) => p.is_first() || p.is_last(),
        }
    }

    /// The captured step's static input buffers once steps replay from a CUDA graph (the next
    /// batch may be written straight into them: [`Trainer::input_buffers`]).
    pub fn input_buffers(&self) -> Option<(Tensor, Tensor)> {
        match self {
            Stepper::Whole(t) => t.input_buffers(),
            Stepper::Stage(_) => None,
        }
    }

    /// Hands one step on `batch` (`None` on a pipeline's middle stage) in `micro_batches` with
    /// rate `lr` to the device, running `meanwhile` on the host once it is queued (a pipeline
    /// step: once it ran).
    pub fn launch_then(
        &mut self,
        batch: Option<&(Tensor, Tensor)>,
        (micro_batches, lr): (usize, f64),
        meanwhile: &mut dyn FnMut(),
    ) -> Result<Launched> {
        match (self, batch) {
            (Stepper::Whole(t), Some((x, y))) => Ok(Launched::Whole(t.launch_then(
                x,
                y,
                (micro_batches, lr),
                meanwhile,
            )?)),
            (Stepper::Whole(_), None) => bail!("a whole model's step needs its batch"),
            (Stepper::Stage(p), batch) => {
                let out = p.step(batch.map(|b| &b.0), batch.map(|b| &b.1), lr)?;
                meanwhile();
                let local = vec![
                    out.bubble,
                    out.peak_in_flight as f64,
                    out.peak_activation_bytes as f64,
                ];
                let all: Vec<f64> = p.pipeline().all_gather(Buffer::from(local)).wait_vec()?;
                let column = |k: usize| all.iter().skip(k).step_by(3).copied();
                let report = PipelineReport {
                    bubble: column(0).collect(),
                    bubble_theory: out.theoretical_bubble,
                    peak_micro_batches: column(1).map(|p| p as usize).collect(),
                    peak_activation_bytes: column(2).map(|b| b as usize).collect(),
                };
                Ok(Launched::Stage(out.step, report))
            }
        }
    }

    /// The outcome of a launched step once the device ran it, with a pipeline's measurements.
    pub fn finish(&mut self, launched: Launched) -> Result<(StepOutcome, Option<PipelineReport>)> {
        match (self, launched) {
            (Stepper::Whole(t), Launched::Whole(step)) => Ok((t.finish(step)?, None)),
            (_, Launched::Stage(outcome, report)) => Ok((outcome, Some(report))),
            (Stepper::Stage(_), Launched::Whole(_)) => {
                bail!("a whole model's step finished on a pipeline stage")
            }
        }
    }

    /// The loss sums of `batch` in evaluation mode (`None` on a middle stage), through the
    /// pipeline in `micro_batches` when there is one.
    pub fn evaluate(
        &mut self,
        batch: Option<&(Tensor, Tensor)>,
        micro_batches: usize,
    ) -> Result<EvalOutcome> {
        match (self, batch) {
            (Stepper::Whole(t), Some((x, y))) => Ok(t.evaluate(x, y)?),
            (Stepper::Whole(_), None) => bail!("a whole model's evaluation needs its batch"),
            (Stepper::Stage(p), batch) => {
                Ok(p.evaluate_in(batch.map(|b| &b.0), batch.map(|b| &b.1), micro_batches)?)
            }
        }
    }

    /// Makes every parameter whole on this rank (ZeRO-3 gathers them: a collective), to save
    /// the model; a pipeline stage's are whole already (ZeRO-3 is refused with one).
    pub fn gather_parameters(&mut self) -> weft_parallel::Result<()> {
        match self {
            Stepper::Whole(t) => t.gather_parameters(),
            Stepper::Stage(_) => Ok(()),
        }
    }
}
