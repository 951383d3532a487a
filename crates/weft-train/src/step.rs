//! One optimizer step of a block model: block-wise forward, cross-entropy loss, block-wise
//! backward writing each block's gradients into the flat gradient buffer the moment they are
//! final (and telling the gradient synchronisation, which may start communicating them), then
//! one fused optimizer update over the flat parameter buffer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use candle_core::{DType, Tensor};
use weft_models::loss;
use weft_optim::{Optimizer, TensorSgd};
use weft_parallel::GradientSync;
use weft_tensor::{tape, BlockModel, Checkpointing, FlatBuffer, FlatLayout, Mode, Timeline};

/// Where the time of one step went.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepTimings {
    pub forward: Duration,
    pub backward: Duration,
    /// Waiting for gradient communication after backward.
    pub sync: Duration,
    pub optimizer: Duration,
}

impl StepTimings {
    pub fn total(&self) -> Duration {
        self.forward + self.backward + self.sync + self.optimizer
    }
}

/// What one step measured (this rank's part of the batch).
#[derive(Debug, Clone, Copy)]
pub struct StepOutcome {
    /// Mean loss over this rank's samples, before the update.
    pub loss: f64,
    /// Correct top-1 predictions among this rank's samples.
    pub correct: usize,
    pub samples: usize,
    pub timings: StepTimings,
}

/// An optimizer over flat buffers of the model's dtype: over host slices (exact, for CPU
/// buffers; GPU buffers make a round trip through the host), or over the flat tensor itself
/// on its own device.
pub enum FlatOptimizer {
    F32(Box<dyn Optimizer<f32> + Send>),
    F64(Box<dyn Optimizer<f64> + Send>),
    /// SGD as tensor operations on the parameters' device, for GPU training.
    Tensor(TensorSgd),
}

impl FlatOptimizer {
    /// The dtype the optimizer needs, `None` when it takes any (tensor operations).
    fn dtype(&self) -> Option<DType> {
        match self {
            FlatOptimizer::F32(_) => Some(DType::F32),
            FlatOptimizer::F64(_) => Some(DType::F64),
            FlatOptimizer::Tensor(_) => None,
        }
    }

    /// Sets the learning rate and steps `params` (in place) with `grads`.
    fn step(&mut self, params: &FlatBuffer, grads: &FlatBuffer, lr: f64) -> Result<()> {
        let range = 0..params.layout().len();
        let mut result = Ok(());
        match self {
            FlatOptimizer::F32(opt) => {
                opt.set_lr(lr)?;
                params.update_with(grads, range, |p: &mut [f32], g: &[f32]| {
                    result = opt.step(p, g)
                })?
            }
            FlatOptimizer::F64(opt) => {
                opt.set_lr(lr)?;
                params.update_with(grads, range, |p: &mut [f64], g: &[f64]| {
                    result = opt.step(p, g)
                })?
            }
            FlatOptimizer::Tensor(opt) => {
                opt.set_lr(lr)?;
                let updated = opt.step(params.tensor(), grads.tensor())?;
                params.tensor().slice_set(&updated, 0, 0)?;
            }
        }
        result.map_err(|e| anyhow!("optimizer step: {e}"))
    }
}

/// A model with its flat master parameters, flat gradients, optimizer and gradient sync.
pub struct Trainer {
    model: BlockModel,
    params: FlatBuffer,
    grads: FlatBuffer,
    optimizer: FlatOptimizer,
    checkpointing: Checkpointing,
    mode: Mode,
    sync: Option<Box<dyn GradientSync + Send>>,
    timeline: Option<Arc<Timeline>>,
    synchronized_timings: bool,
}

impl Trainer {
    /// Flattens `model`'s parameters (a master copy in the model's dtype) for `optimizer`.
    pub fn new(
        model: BlockModel,
        optimizer: FlatOptimizer,
        checkpointing: Checkpointing,
    ) -> Result<Self> {
        let layout = FlatLayout::parameters(model.store());
        let dtype = model.store().dtype();
        if let Some(needed) = optimizer.dtype().filter(|&d| d != dtype) {
            anyhow::bail!("the optimizer works on {needed:?} but the model is {dtype:?}");
        }
        let params = FlatBuffer::from_store(model.store(), layout.clone(), dtype)?;
        let grads = FlatBuffer::zeros(layout, dtype, model.store().device())?;
        Ok(Self {
            model,
            params,
            grads,
            optimizer,
            checkpointing,
            mode: Mode::TRAIN,
            sync: None,
            timeline: None,
            synchronized_timings: false,
        })
    }

    /// Synchronises gradients across ranks with `sync` (data parallelism).
    pub fn with_sync(mut self, sync: Box<dyn GradientSync + Send>) -> Self {
        self.sync = Some(sync);
        self
    }

    /// Trains in `mode` (e.g. BatchNorm with running statistics for exact-equivalence tests).
    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Records forward, backward and optimizer spans on `timeline`.
    pub fn with_timeline(mut self, timeline: Arc<Timeline>) -> Self {
        self.timeline = Some(timeline);
        self
    }

    /// Waits for the device at the end of each phase (forward, backward, optimizer) before
    /// reading the clock, so that [`StepTimings`] measure the device's work, not the host's
    /// issuing of it. For benchmarks: it removes the overlap of host and device.
    pub fn with_synchronized_timings(mut self) -> Self {
        self.synchronized_timings = true;
        self
    }

    /// Time since `start`, after the device has finished its queued work when timings are
    /// synchronized.
    fn lap(&self, start: Instant) -> Result<Duration> {
        if self.synchronized_timings {
            self.model.store().device().synchronize()?;
        }
        Ok(start.elapsed())
    }

    pub fn model(&self) -> &BlockModel {
        &self.model
    }

    /// The flat gradient buffer (its layout is the parameters' layout).
    pub fn grads(&self) -> &FlatBuffer {
        &self.grads
    }

    /// Trains on one batch (`images` NCHW, `labels` u32) with learning rate `lr`.
    pub fn step(&mut self, images: &Tensor, labels: &Tensor, lr: f64) -> Result<StepOutcome> {
        self.step_accumulated(&[(images.clone(), labels.clone())], lr)
    }

    /// One optimizer step over several micro-batches whose gradients are accumulated: only the
    /// last micro-batch's backward communicates (`no_sync` for the others). Each micro-batch's
    /// loss is divided by their number, so the result equals one step on their concatenation.
    pub fn step_accumulated(
        &mut self,
        micro_batches: &[(Tensor, Tensor)],
        lr: f64,
    ) -> Result<StepOutcome> {
        let mut timings = StepTimings::default();
        let (mut loss_sum, mut correct, mut samples) = (0.0, 0, 0);
        let k = micro_batches.len();
        for (i, (images, labels)) in micro_batches.iter().enumerate() {
            if let Some(sync) = self.sync.as_mut() {
                sync.set_require_sync(i + 1 == k);
            }
            let (loss, hits) = self.forward_backward(images, labels, k, i > 0, &mut timings)?;
            loss_sum += loss * labels.elem_count() as f64;
            correct += hits;
            samples += labels.elem_count();
        }
        let start = Instant::now();
        if let Some(sync) = self.sync.as_mut() {
            sync.finish(&self.grads)?;
        }
        timings.sync = start.elapsed();

        let start = Instant::now();
        self.optimizer.step(&self.params, &self.grads, lr)?;
        self.params.copy_to_store(self.model.store())?;
        timings.optimizer = self.lap(start)?;
        if let Some(t) = &self.timeline {
            t.record("optimizer", "optimizer", "compute", start, Instant::now());
        }
        Ok(StepOutcome {
            loss: loss_sum / samples.max(1) as f64,
            correct,
            samples,
            timings,
        })
    }

    /// Forward and backward of one micro-batch; gradients are written (or, when
    /// `accumulate`, added) into the flat gradient buffer. Returns the unscaled mean loss.
    fn forward_backward(
        &mut self,
        images: &Tensor,
        labels: &Tensor,
        micro_batches: usize,
        accumulate: bool,
        timings: &mut StepTimings,
    ) -> Result<(f64, usize)> {
        let start = Instant::now();
        if let Some(sync) = self.sync.as_mut() {
            sync.before_forward(self.model.store())?;
        }
        let tape = tape::forward_traced(
            &self.model,
            images,
            self.mode,
            &self.checkpointing,
            self.timeline.clone(),
        )?;
        let logits = tape.output().clone();
        let batch_loss = loss::cross_entropy(&logits, labels)?;
        let scaled = if micro_batches > 1 {
            (&batch_loss / micro_batches as f64)?
        } else {
            batch_loss.clone()
        };
        timings.forward += self.lap(start)?;

        let start = Instant::now();
        let (model, grads, sync) = (&self.model, &self.grads, &mut self.sync);
        let mut block_params = Vec::new();
        tape.backward(&scaled, model, |ready| -> weft_parallel::Result<()> {
            block_params.clear();
            for (id, grad) in ready.grads {
                let grad = grad.ok_or_else(|| weft_parallel::ParallelError::UnusedParameter {
                    name: model.store().entries()[id].name.clone(),
                })?;
                let slot = grads
                    .layout()
                    .slot_of(id)
                    .expect("every parameter has a slot");
                if accumulate {
                    grads.accumulate(slot, &grad)?;
                } else {
                    grads.write(slot, &grad)?;
                }
                block_params.push(id);
            }
            if let Some(sync) = sync.as_mut() {
                sync.block_ready(&block_params, grads)?;
            }
            Ok(())
        })?;
        timings.backward += self.lap(start)?;
        Ok((
            batch_loss.to_dtype(DType::F64)?.to_scalar()?,
            loss::correct_predictions(&logits, labels)?,
        ))
    }

    /// Loss sum and correct predictions on one batch in evaluation mode (no gradients kept).
    pub fn evaluate(&self, images: &Tensor, labels: &Tensor) -> Result<(f64, usize)> {
        let logits = self.model.forward(images, Mode::EVAL)?.detach();
        let mean_loss: f64 = loss::cross_entropy(&logits, labels)?
            .to_dtype(DType::F64)?
            .to_scalar()?;
        Ok((
            mean_loss * labels.elem_count() as f64,
            loss::correct_predictions(&logits, labels)?,
        ))
    }
}
