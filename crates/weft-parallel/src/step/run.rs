//! The body of a step: each micro-batch's forward and backward with the strategy's hooks
//! (gradients written into the flat buffer as they become final), then the update — the loss
//! scale undone and checked, the gradients clipped, this rank's range stepped.

use std::ops::Range;
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
        let mut summed = None;
        for (i, (inputs, targets)) in micro_batches.iter().enumerate() {
            let last = i + 1 == micro_batches.len();
            self.set_require_sync(last);
            let weight = self.objective.samples(targets) as f64 / total.max(1) as f64;
            let start = Instant::now();
            self.strategy_before_forward()?;
            let tape = self.forward_tape(inputs, i, false)?;
            let (result, seed) = self.weighted_loss(&tape, targets, weight)?;
            results.push(result);
            timings.forward += self.lap(start)?;
            if last {
                // The loss summed over every replica's samples (and their count), started
                // before the last backward so that its collective runs beside it: the host
                // need not sum them over the job between steps.
                summed = self
                    .strategy
                    .start_sum_over_replicas(&mut || local_loss_sum(&results))?;
            }
            let start = Instant::now();
            self.backward_tape(tape, seed.as_seed(), i > 0)?;
            timings.backward += self.lap(start)?;
        }
        if let Some(norm) = self.update(&mut timings)? {
            // Not a sum over samples: only the last micro-batch's result carries it.
            if let Some(last) = results.last_mut() {
                last.metrics.push(("grad_norm", norm));
            }
        }
        if let (Some(summed), Some(last)) = (summed, results.last_mut()) {
            last.metrics.push((REPLICAS_LOSS_SUM, summed.get(0)?));
            last.metrics.push((REPLICAS_SAMPLES, summed.get(1)?));
        }
        Ok((results, timings))
    }

    /// Whether the next backward communicates (the last micro-batch's does).
    pub(crate) fn set_require_sync(&mut self, sync: bool) {
        self.strategy.set_require_sync(sync)
    }

    /// Allocates the gradients and makes the master copy at the first step.
    pub(crate) fn prepare(&mut self) -> Result<()> {
        if !self.capturing {
            self.write_dropout_step(self.steps_taken)?;
        }
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
        // A loss scaler, clipping and the delayed update read every gradient before the
        // update; otherwise the strategy may hold one range back until the rest is stepped.
        let reads_all_first = self.scale_on_device.is_some()
            || self.clip_grad_norm.is_some()
            || self.delays_this_update();
        let held = match reads_all_first {
            true => self.strategy.finish_backward(&self.grads).map(|()| None)?,
            false => self.strategy.finish_backward_holding_last(&self.grads)?,
        };
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
            let (params, grads, strategy) = (self.params.as_ref(), &self.grads, &mut self.strategy);
            let parts = update_parts(&range, held.as_ref());
            let held_part = parts.len() - 1;
            optimizer.step_in_parts(
                params,
                grads,
                self.model.store(),
                range,
                skip.as_ref(),
                &parts,
                |part| match held.is_some() && part == held_part {
                    true => strategy.finish_held_gradients(grads),
                    false => Ok(()),
                },
            )?;
            self.strategy.after_step(&self.model)?;
        }
        self.record_memory("optimizer", 0)?;
        timings.optimizer = self.lap(start)?;
        if let Some(span) = span {
            span.close();
        }
        Ok(norm)
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
            .with_dropout_seed(self.micro_batch_seed(micro))
            .with_dropout_step(self.dropout_step(self.steps_taken));
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

/// The parts of `range` the optimizer steps in order: what lies outside `held` (the range
/// whose gradients the strategy still reduces), then `held`'s share, last; the whole range
/// when nothing is held.
fn update_parts(range: &Range<usize>, held: Option<&Range<usize>>) -> Vec<Range<usize>> {
    let Some(held) = held else {
        return vec![range.clone()];
    };
    let inside = held.start.max(range.start)..held.end.min(range.end);
    if inside.is_empty() {
        return vec![range.clone()];
    }
    [range.start..inside.start, inside.end..range.end, inside]
        .into_iter()
        .filter(|part| !part.is_empty())
        .collect()
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

#[cfg(test)]
mod tests {
    use super::update_parts;

    #[test]
    fn the_held_range_is_stepped_last() {
        assert_eq!(update_parts(&(0..100), None), vec![0..100]);
        assert_eq!(
            update_parts(&(0..100), Some(&(0..30))),
            vec![30..100, 0..30]
        );
        assert_eq!(
            update_parts(&(0..100), Some(&(40..60))),
            vec![0..40, 60..100, 40..60]
        );
        assert_eq!(update_parts(&(0..100), Some(&(0..100))), vec![0..100]);
        // A shard's range meets only part of the held bucket, or none of it.
        assert_eq!(
            update_parts(&(50..100), Some(&(0..60))),
            vec![60..100, 50..60]
        );
        assert_eq!(update_parts(&(50..100), Some(&(0..30))), vec![50..100]);
    }
}
