//! The body of a step: each micro-batch's forward and backward with the strategy's hooks
//! (gradients written into the flat buffer as they become final), then the update — the loss
//! scale undone and checked, the gradients clipped, this rank's range stepped.

use std::time::Instant;

use candle_core::Tensor;
use weft_tensor::tape::{self, BackwardHooks, Seed, Tape, TapeOptions};
use weft_tensor::{BlockGrads, BlockModel, FlatBuffer, Slot};

use super::outcome::{
    local_loss_sum, BatchResult, StepTimings, REPLICAS_LOSS_SUM, REPLICAS_SAMPLES,
};
use super::Trainer;
use crate::clip::clip_grad_norm;
use crate::error::{ParallelError, Result};
use crate::strategy::{ReadyGrads, Strategy};

impl Trainer {
    /// Forward, backward, gradient sync and optimizer update of one step, issued to the device
    /// without waiting for it (unless timings are synchronised); the learning rate is set.
    pub(crate) fn run(
        &mut self,
        micro_batches: &[(Tensor, Tensor)],
    ) -> Result<(Vec<BatchResult>, StepTimings)> {
        self.prepare()?;
        let mut timings = StepTimings::default();
        let total: usize = micro_batches
            .iter()
            .map(|(_, t)| self.objective.samples(t))
            .sum();
        let mut results = Vec::with_capacity(micro_batches.len());
        for (i, (inputs, targets)) in micro_batches.iter().enumerate() {
            self.set_require_sync(i + 1 == micro_batches.len());
            let weight = self.objective.samples(targets) as f64 / total.max(1) as f64;
            results.push(self.forward_backward(inputs, targets, weight, i, &mut timings)?);
        }
        if let Some(norm) = self.update(&mut timings)? {
            // Not a sum over samples: only the last micro-batch's result carries it.
            if let Some(last) = results.last_mut() {
                last.metrics.push(("grad_norm", norm));
            }
        }
        self.sum_loss_over_replicas(&mut results)?;
        Ok((results, timings))
    }

    /// The step's loss summed over every replica's samples, and their count, as two more
    /// metrics of the last micro-batch (a collective on the device, within a captured step), so
    /// that the host need not sum them over the job between steps.
    fn sum_loss_over_replicas(&mut self, results: &mut [BatchResult]) -> Result<()> {
        let summed = self
            .strategy
            .sum_over_replicas(&mut || local_loss_sum(results))?;
        if let (Some(summed), Some(last)) = (summed, results.last_mut()) {
            last.metrics.push((REPLICAS_LOSS_SUM, summed.get(0)?));
            last.metrics.push((REPLICAS_SAMPLES, summed.get(1)?));
        }
        Ok(())
    }

    /// The strategy's call before each micro-batch's forward.
    pub(crate) fn strategy_before_forward(&mut self) -> Result<()> {
        self.strategy.before_forward(&self.model)
    }

    /// Whether the next backward communicates (the last micro-batch's does).
    pub(crate) fn set_require_sync(&mut self, sync: bool) {
        self.strategy.set_require_sync(sync)
    }

    /// Allocates the gradients and makes the master copy at the first step.
    pub(crate) fn prepare(&mut self) -> Result<()> {
        self.allocate_gradients()?;
        if self.params.is_none() {
            self.reload_master_weights()?;
        }
        self.make_scale_on_device()
    }

    /// After the last backward of a step: the strategy's gradient sync, the loss scale undone
    /// and checked (the step skipped on an inf or NaN anywhere), the gradients clipped, this
    /// rank's range stepped. Returns the gradient norm before clipping (on the device), when
    /// clipping.
    pub(crate) fn update(&mut self, timings: &mut StepTimings) -> Result<Option<Tensor>> {
        self.steps_taken += 1;
        let start = Instant::now();
        self.strategy.finish_backward(&self.grads)?;
        timings.sync = start.elapsed();

        let start = Instant::now();
        let span = self
            .options
            .timeline
            .as_ref()
            .map(|t| t.open("optimizer", "optimizer", "compute"));
        let range = self.strategy.optimizer_range(self.grads.layout().len());
        // With a loss scaler: the found-inf flag of every rank, on the device, where it moves
        // the scale and where the optimizer reads it (no host read: a CUDA graph captures this).
        let skip = match &self.scale_on_device {
            Some(on_device) => {
                let local = self.grads.local(&range)?;
                let found = on_device.unscale_and_check(self.grads.tensor(), local)?;
                let found = self.strategy.reduce_found_inf(found)?;
                on_device.update(&found)?;
                Some(found)
            }
            None => None,
        };
        let norm = match self.clip_grad_norm {
            Some(max_norm) => Some(clip_grad_norm(
                &self.grads,
                range.clone(),
                max_norm,
                self.strategy.as_mut(),
            )?),
            None => None,
        };
        if self.delays_this_update() {
            // The delayed update runs on the host later: it reads the flag here.
            let skipped = match &skip {
                Some(found) => found.flatten_all()?.to_vec1::<f32>()?[0] != 0.0,
                None => false,
            };
            if !skipped {
                self.delayed_update(range)?;
            }
        } else {
            self.strategy.before_update(&self.model)?;
            self.settle()?;
            let optimizer = self.optimizer.as_mut().ok_or_else(super::lost_optimizer)?;
            let (params, grads) = (self.params.as_ref(), &self.grads);
            optimizer.step(params, grads, self.model.store(), range, skip.as_ref())?;
            self.strategy.after_step(&self.model)?;
        }
        self.record_memory("optimizer", 0)?;
        timings.optimizer = self.lap(start)?;
        if let Some(span) = span {
            span.close();
        }
        Ok(norm)
    }

    /// Forward and backward of micro-batch `micro` whose loss is scaled by `weight`; gradients
    /// are written (the first micro-batch) or added (the others) into the flat gradient buffer.
    /// Returns the unscaled mean loss and the metrics, on the device.
    fn forward_backward(
        &mut self,
        inputs: &Tensor,
        targets: &Tensor,
        weight: f64,
        micro: usize,
        timings: &mut StepTimings,
    ) -> Result<BatchResult> {
        let start = Instant::now();
        self.strategy_before_forward()?;
        let tape = self.forward_tape(inputs, micro, false)?;
        let (result, seed) = self.weighted_loss(&tape, targets, weight)?;
        timings.forward += self.lap(start)?;

        let start = Instant::now();
        self.backward_tape(tape, seed.as_seed(), micro > 0)?;
        timings.backward += self.lap(start)?;
        Ok(result)
    }

    /// The block-wise forward of micro-batch `micro`'s `inputs`, the strategy called before
    /// each block; keeps what the gradient of `inputs` needs when `input_grad`.
    pub(crate) fn forward_tape(
        &mut self,
        inputs: &Tensor,
        micro: usize,
        input_grad: bool,
    ) -> Result<Tape> {
        let mode = self
            .options
            .mode
            .with_dropout_seed(self.micro_batch_seed(micro));
        let (model, strategy) = (&self.model, &mut self.strategy);
        let options = TapeOptions {
            input_grad,
            mode,
            ..self.options.clone()
        };
        let tape = tape::forward_with(model, inputs, &options, |block| {
            strategy.before_block_forward(model, block)
        })?;
        if self.memory.is_some() {
            self.record_memory("forward", tape.saved_activation_bytes())?;
        }
        Ok(tape)
    }

    /// The objective's loss of `tape`'s output on `targets` (unscaled, detached, with the
    /// metrics) and where backward starts: the loss scaled by `weight` (the micro-batch's share
    /// of the step's samples) and the loss scale, or that scaled loss's gradient with respect
    /// to the output when the objective computes it directly.
    pub(crate) fn weighted_loss(
        &self,
        tape: &Tape,
        targets: &Tensor,
        weight: f64,
    ) -> Result<(BatchResult, BackwardSeed)> {
        // The loss scale multiplies the seed on the device (a power of two with the default
        // rule: the same bits as folding it into `weight`).
        let scale = |t: Tensor| -> Result<Tensor> {
            match &self.scale_on_device {
                Some(on_device) => Ok(t.broadcast_mul(&on_device.scale_as(t.dtype())?)?),
                None => Ok(t),
            }
        };
        let direct = self
            .objective
            .loss_and_output_grad(tape.output(), targets, weight)?;
        let (output, seed) = match direct {
            Some((output, grad)) => (output, BackwardSeed::OutputGrad(scale(grad)?)),
            None => {
                let output = self.objective.loss(tape.output(), targets)?;
                let weighted = match weight != 1.0 {
                    true => output.loss.affine(weight, 0.0)?,
                    false => output.loss.clone(),
                };
                (output, BackwardSeed::Loss(scale(weighted)?))
            }
        };
        let result = BatchResult {
            loss: output.loss.detach(),
            metrics: output.metrics,
            samples: self.objective.samples(targets),
        };
        Ok((result, seed))
    }

    /// Backward of `tape` from `seed`, gradients written (or, when `accumulate`, added) into
    /// the flat buffer as they become final, the strategy told; returns the gradient of the
    /// tape's input when it kept what that needs.
    pub(crate) fn backward_tape(
        &mut self,
        tape: Tape,
        seed: Seed<'_>,
        accumulate: bool,
    ) -> Result<Option<Tensor>> {
        let mut hooks = GradientWriter {
            model: &self.model,
            grads: &self.grads,
            strategy: self.strategy.as_mut(),
            accumulate,
        };
        let input_grad = tape.backward_with(seed, &self.model, &mut hooks)?;
        self.record_memory("backward", 0)?;
        Ok(input_grad)
    }
}

/// The backward hooks of a step: gradients written into the flat buffer, the strategy told.
struct GradientWriter<'a> {
    model: &'a BlockModel,
    grads: &'a FlatBuffer,
    strategy: &'a mut dyn Strategy,
    accumulate: bool,
}

impl BackwardHooks<ParallelError> for GradientWriter<'_> {
    fn before_block(&mut self, block: usize) -> Result<()> {
        self.strategy.before_block_backward(self.model, block)
    }

    fn block_ready(&mut self, ready: BlockGrads) -> Result<()> {
        let mut report = ReadyGrads {
            block: ready.block,
            ..ReadyGrads::default()
        };
        let mut present: Vec<(&Slot, Tensor)> = Vec::new();
        let mut absent: Vec<&Slot> = Vec::new();
        for (id, grad) in ready.grads {
            let slot = self.grads.layout().slot_of(id).ok_or_else(|| {
                ParallelError::Config(format!(
                    "`{}` has a gradient but no place in the flat buffer",
                    self.model.store().entries()[id].name
                ))
            })?;
            match grad {
                Some(grad) => {
                    present.push((slot, grad));
                    report.params.push(id);
                }
                None => {
                    absent.push(slot);
                    report.unused.push(id);
                }
            }
        }
        if !self.strategy.stage_gradients(&present)? {
            self.write(present, &absent)?;
        }
        self.strategy.block_ready(&report, self.grads)
    }
}

impl GradientWriter<'_> {
    /// Writes (or, when accumulating, adds) a block's gradients into the flat buffer, and
    /// zeros for the parameters that had none.
    fn write(&self, present: Vec<(&Slot, Tensor)>, absent: &[&Slot]) -> Result<()> {
        if self.accumulate {
            for (slot, grad) in &present {
                self.grads.accumulate(slot, grad)?;
            }
            return Ok(());
        }
        let mut written = present;
        for slot in absent {
            let device = self.grads.tensor().device();
            written.push((
                slot,
                Tensor::zeros(slot.numel(), self.grads.dtype(), device)?,
            ));
        }
        let values: Vec<(&Slot, &Tensor)> = written.iter().map(|(s, g)| (*s, g)).collect();
        Ok(self.grads.write_many(&values)?)
    }
}

/// Where a micro-batch's backward starts: its scaled loss (back-propagated through the loss's
/// graph to the output), or the output's gradient itself.
pub(crate) enum BackwardSeed {
    Loss(Tensor),
    OutputGrad(Tensor),
}

impl BackwardSeed {
    pub(crate) fn as_seed(&self) -> Seed<'_> {
        match self {
            BackwardSeed::Loss(loss) => Seed::Loss(loss),
            BackwardSeed::OutputGrad(grad) => Seed::OutputGrad(grad),
        }
    }
}
