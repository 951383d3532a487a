//! How a batch becomes one step: whole (replayed from the CUDA graph where one is captured),
//! split into equal micro-batches, or as given micro-batches whose gradients accumulate before
//! one update; and what each step reports once the device has run it.

use candle_core::Tensor;

use super::outcome::outcome;
use super::{StepOutcome, Trainer};
use crate::error::{ParallelError, Result};

impl Trainer {
    /// Trains on one batch (`inputs` and `targets` as the objective takes them) with
    /// learning rate `lr`.
    pub fn step(&mut self, inputs: &Tensor, targets: &Tensor, lr: f64) -> Result<StepOutcome> {
        self.step_then(inputs, targets, lr, &mut || {})
    }

    /// [`Self::step`], running `meanwhile` on the host once the step is queued on the device
    /// and before its results are read (e.g. staging the next batch while the GPU trains on
    /// this one); on the CPU, after the step's work.
    pub fn step_then(
        &mut self,
        inputs: &Tensor,
        targets: &Tensor,
        lr: f64,
        meanwhile: &mut dyn FnMut(),
    ) -> Result<StepOutcome> {
        #[cfg(feature = "cuda")]
        if let Some(mut graph) = self.graph.take() {
            let result = graph.step(self, (inputs, targets, lr), meanwhile);
            self.graph = Some(graph);
            let mut out = result?;
            self.report_scaling(&mut out)?;
            return Ok(out);
        }
        self.step_accumulated_then(&[(inputs.clone(), targets.clone())], lr, meanwhile)
    }

    /// One step on a batch split along its first dimension into `micro_batches` equal
    /// micro-batches whose gradients accumulate before the update.
    pub fn step_micro_batches(
        &mut self,
        inputs: &Tensor,
        targets: &Tensor,
        micro_batches: usize,
        lr: f64,
    ) -> Result<StepOutcome> {
        self.step_micro_batches_then(inputs, targets, (micro_batches, lr), &mut || {})
    }

    /// [`Self::step_micro_batches`] with `meanwhile` run as [`Self::step_then`] runs it.
    pub fn step_micro_batches_then(
        &mut self,
        inputs: &Tensor,
        targets: &Tensor,
        (micro_batches, lr): (usize, f64),
        meanwhile: &mut dyn FnMut(),
    ) -> Result<StepOutcome> {
        if micro_batches <= 1 {
            return self.step_then(inputs, targets, lr, meanwhile);
        }
        let rows = inputs.dim(0)?;
        if !rows.is_multiple_of(micro_batches) || targets.dim(0)? != rows {
            return Err(ParallelError::Config(format!(
                "a batch of {rows} samples cannot be split into {micro_batches} micro-batches"
            )));
        }
        let per = rows / micro_batches;
        let parts = (0..micro_batches)
            .map(|m| {
                Ok((
                    inputs.narrow(0, m * per, per)?,
                    targets.narrow(0, m * per, per)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        self.step_accumulated_then(&parts, lr, meanwhile)
    }

    /// One optimizer step over several micro-batches whose gradients are accumulated: only the
    /// last micro-batch's backward communicates (`no_sync` for the others). Each micro-batch's
    /// loss is weighted by its share of the samples, so the result equals one step on their
    /// concatenation.
    pub fn step_accumulated(
        &mut self,
        micro_batches: &[(Tensor, Tensor)],
        lr: f64,
    ) -> Result<StepOutcome> {
        self.step_accumulated_then(micro_batches, lr, &mut || {})
    }

    /// [`Self::step_accumulated`] with `meanwhile` run as [`Self::step_then`] runs it.
    pub(crate) fn step_accumulated_then(
        &mut self,
        micro_batches: &[(Tensor, Tensor)],
        lr: f64,
        meanwhile: &mut dyn FnMut(),
    ) -> Result<StepOutcome> {
        self.set_lr(lr)?;
        let (results, timings) = self.run(micro_batches)?;
        meanwhile();
        self.wait_for_device()?;
        let mut out = outcome(&results, timings)?;
        self.report_scaling(&mut out)?;
        Ok(out)
    }

    /// Adds the loss scale and whether the update was skipped to `out` (with a loss scaler; read
    /// from the device once the step is done).
    pub(crate) fn report_scaling(&self, out: &mut StepOutcome) -> Result<()> {
        if let Some(on_device) = &self.scale_on_device {
            let (state, skipped) = on_device.read()?;
            out.loss_scale = Some(state.scale);
            out.skipped = skipped;
        }
        Ok(())
    }

    /// Sets the learning rate of the next update (of an optimizer away on a delayed update,
    /// once it is back).
    pub(crate) fn set_lr(&mut self, lr: f64) -> Result<()> {
        self.lr = Some(lr);
        if let Some(optimizer) = self.optimizer.as_mut() {
            optimizer.set_lr(lr)?;
        }
        Ok(())
    }

    /// Waits for the strategy's device-ordered work (watched: a dead peer is an error,
    /// not a hang), before the step's results are read.
    pub(crate) fn wait_for_device(&mut self) -> Result<()> {
        self.strategy.wait_for_device()
    }
}
