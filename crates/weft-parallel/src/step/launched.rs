//! A step handed to the device now and read later ([`Trainer::launch`], [`Trainer::finish`]).
//!
//! A training loop that reads each step's loss before launching the next leaves the device
//! idle between steps while the host reads, reports and launches again (about 0.4 ms a step
//! of ResNet-50 on an H100). Launching step N+1 before finishing step N keeps the device busy:
//! a replay of the captured CUDA graph is queued behind the one still running, its outputs
//! copied to the host behind it. Every other step (eager, warming up, capturing, loss-scaled,
//! split into micro-batches) runs to completion when it is launched, so a loop written this
//! way is correct everywhere and overlaps where it can.

use candle_core::Tensor;

use super::{StepOutcome, Trainer};
use crate::error::Result;

/// A step launched by [`Trainer::launch`]; [`Trainer::finish`] gives its outcome.
///
/// A loop that keeps one step in flight, reading each step after launching the next:
///
/// ```no_run
/// # fn demo(trainer: weft_parallel::Trainer, batches: Vec<(candle_core::Tensor, candle_core::Tensor)>)
/// # -> weft_parallel::Result<()> {
/// let mut trainer = trainer.with_cuda_graph();
/// let mut in_flight = None;
/// for (inputs, targets) in &batches {
///     let launched = trainer.launch(inputs, targets, (1, 0.1))?;
///     // The step before this one, read while this one runs.
///     if let Some(earlier) = in_flight.replace(launched) {
///         println!("loss {:.4}", trainer.finish(earlier)?.loss);
///     }
/// }
/// if let Some(last) = in_flight {
///     println!("loss {:.4}", trainer.finish(last)?.loss);
/// }
/// # Ok(())
/// # }
/// ```
#[must_use = "a launched step holds one of the trainer's result slots until it is finished"]
pub struct LaunchedStep(Launched);

enum Launched {
    /// Run to completion when launched.
    Done(StepOutcome),
    /// A replay queued on the device.
    #[cfg(feature = "cuda")]
    Replay(super::cuda_graph::QueuedReplay),
}

impl LaunchedStep {
    /// Whether the step may still be running on the device (a queued replay).
    pub fn is_queued(&self) -> bool {
        !matches!(self.0, Launched::Done(_))
    }
}

impl Trainer {
    /// Hands one step on the batch (split into `micro_batches` as
    /// [`Self::step_micro_batches`] splits it) to the device with learning rate `lr`. A replay
    /// of the captured CUDA graph (one micro-batch, no loss scaler) returns once it is queued;
    /// any other step runs to completion here. Steps run in the order they are launched;
    /// at most two may be launched and not yet finished. Anything that reads or writes the
    /// model between two steps (evaluation, a checkpoint) finishes the earlier first and
    /// launches the later after it.
    pub fn launch(
        &mut self,
        inputs: &Tensor,
        targets: &Tensor,
        (micro_batches, lr): (usize, f64),
    ) -> Result<LaunchedStep> {
        self.launch_then(inputs, targets, (micro_batches, lr), &mut || {})
    }

    /// [`Self::launch`], running `meanwhile` on the host once the step is queued on the device
    /// (as [`Self::step_then`] runs it: before an eager step's results are read).
    pub fn launch_then(
        &mut self,
        inputs: &Tensor,
        targets: &Tensor,
        (micro_batches, lr): (usize, f64),
        meanwhile: &mut dyn FnMut(),
    ) -> Result<LaunchedStep> {
        #[cfg(feature = "cuda")]
        if micro_batches <= 1 && self.scaler.is_none() {
            if let Some(mut graph) = self.graph.take() {
                let queued = graph
                    .replays(inputs, targets)
                    .then(|| graph.queue(self, (inputs, targets, lr)));
                self.graph = Some(graph);
                if let Some(queued) = queued {
                    let queued = queued?;
                    meanwhile();
                    return Ok(LaunchedStep(Launched::Replay(queued)));
                }
            }
        }
        let outcome =
            self.step_micro_batches_then(inputs, targets, (micro_batches, lr), meanwhile)?;
        Ok(LaunchedStep(Launched::Done(outcome)))
    }

    /// The captured step's static input buffers `(inputs, targets)` once steps replay (with
    /// the `cuda` feature; `None` otherwise). A loop may write its next batch straight into
    /// them — after launching the step that reads what they hold (in its `meanwhile` or
    /// later: the device runs the write behind that step) — and launch the next step on the
    /// buffers themselves, which then copies no batch.
    pub fn input_buffers(&self) -> Option<(Tensor, Tensor)> {
        #[cfg(feature = "cuda")]
        if let Some(graph) = &self.graph {
            return graph.input_buffers();
        }
        None
    }

    /// The outcome of a launched step, once the device has run it (watched for dead peers as
    /// [`Self::step`]'s own wait is).
    pub fn finish(&mut self, step: LaunchedStep) -> Result<StepOutcome> {
        match step.0 {
            Launched::Done(outcome) => Ok(outcome),
            #[cfg(feature = "cuda")]
            Launched::Replay(queued) => match self.graph.as_mut() {
                Some(graph) => graph.finish(queued),
                None => Err(crate::error::ParallelError::CudaGraph(
                    "a queued replay outlived its graph".into(),
                )),
            },
        }
    }
}
