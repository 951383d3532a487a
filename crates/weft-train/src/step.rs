//! One optimizer step of a block model: block-wise forward, cross-entropy loss, block-wise
//! backward writing each block's gradients into the flat gradient buffer the moment they are
//! final (and telling the gradient synchronisation, which may start communicating them), then
//! one fused optimizer update. The loss and hit count stay on the device until the update has
//! been issued, so the step itself never waits for the device; on one GPU the whole step can
//! be captured once and replayed as a CUDA graph ([`Trainer::with_cuda_graph`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use candle_core::{DType, Tensor, D};
use weft_models::loss;
use weft_parallel::GradientSync;
use weft_tensor::{tape, BlockModel, Checkpointing, FlatBuffer, FlatLayout, Mode, Slot, Timeline};

pub use crate::flat_optimizer::FlatOptimizer;

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
    /// The phases' times; all zero for a step replayed from a CUDA graph (one launch).
    pub timings: StepTimings,
    /// Whether the step was replayed from a CUDA graph.
    pub graphed: bool,
}

/// One micro-batch's mean loss and hit count, still on the device.
pub(crate) struct BatchResult {
    pub loss: Tensor,
    pub hits: Tensor,
    pub samples: usize,
}

impl BatchResult {
    /// Reads the mean loss and the hit count (waits for the device).
    fn read(&self) -> Result<(f64, usize)> {
        Ok((
            self.loss.to_dtype(DType::F64)?.to_scalar::<f64>()?,
            self.hits.to_scalar::<u32>()? as usize,
        ))
    }
}

/// The outcome of the micro-batches `results` of one step, read from the device.
pub(crate) fn outcome(results: &[BatchResult], timings: StepTimings) -> Result<StepOutcome> {
    let (mut loss_sum, mut correct, mut samples) = (0.0, 0, 0);
    for r in results {
        let (loss, hits) = r.read()?;
        loss_sum += loss * r.samples as f64;
        correct += hits;
        samples += r.samples;
    }
    Ok(StepOutcome {
        loss: loss_sum / samples.max(1) as f64,
        correct,
        samples,
        timings,
        graphed: false,
    })
}

/// A model with its flat gradients, optimizer (with a flat master copy of the parameters where
/// it needs one) and gradient sync.
pub struct Trainer {
    model: BlockModel,
    params: Option<FlatBuffer>,
    grads: FlatBuffer,
    optimizer: FlatOptimizer,
    checkpointing: Checkpointing,
    mode: Mode,
    sync: Option<Box<dyn GradientSync + Send>>,
    timeline: Option<Arc<Timeline>>,
    pub(crate) synchronized_timings: bool,
    #[cfg(feature = "cuda")]
    graph: Option<crate::cuda_graph::StepGraph>,
}

impl Trainer {
    /// Lays out `model`'s parameters in flat buffers (gradients; a master copy of the
    /// parameters in the model's dtype where `optimizer` needs one).
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
        let params = if optimizer.needs_master_copy() {
            Some(FlatBuffer::from_store(
                model.store(),
                layout.clone(),
                dtype,
            )?)
        } else {
            None
        };
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
            #[cfg(feature = "cuda")]
            graph: None,
        })
    }

    /// On a GPU, captures a step into a CUDA graph after a few eager warm-up steps and replays
    /// it for every later batch of the same shape: one launch per step instead of a thousand.
    /// With a gradient sync only if its operations can be captured (data parallelism over
    /// NCCL: ordered on the device). If capturing fails the trainer says why once and stays
    /// eager. Without the `cuda` feature, or on other devices, nothing changes. Call it after
    /// [`Self::with_sync`].
    #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
    pub fn with_cuda_graph(mut self) -> Self {
        #[cfg(feature = "cuda")]
        if self.model.store().device().is_cuda()
            && self.sync.as_ref().is_none_or(|s| s.capturable())
        {
            self.graph = Some(crate::cuda_graph::StepGraph::default());
        }
        self
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

    #[cfg(feature = "cuda")]
    pub(crate) fn optimizer_mut(&mut self) -> &mut FlatOptimizer {
        &mut self.optimizer
    }

    /// The flat gradient buffer (its layout is the parameters' layout).
    pub fn grads(&self) -> &FlatBuffer {
        &self.grads
    }

    /// Trains on one batch (`images` NCHW, `labels` u32) with learning rate `lr`.
    pub fn step(&mut self, images: &Tensor, labels: &Tensor, lr: f64) -> Result<StepOutcome> {
        #[cfg(feature = "cuda")]
        if let Some(mut graph) = self.graph.take() {
            let result = graph.step(self, images, labels, lr);
            self.graph = Some(graph);
            return result;
        }
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
        self.optimizer.set_lr(lr)?;
        let (results, timings) = self.run(micro_batches)?;
        self.wait_for_device()?;
        outcome(&results, timings)
    }

    /// Waits for the gradient sync's device-ordered work (watched: a dead peer is an error,
    /// not a hang), before the step's results are read.
    pub(crate) fn wait_for_device(&mut self) -> Result<()> {
        if let Some(sync) = self.sync.as_mut() {
            sync.wait_for_device()?;
        }
        Ok(())
    }

    /// Forward, backward, gradient sync and optimizer update of one step, issued to the device
    /// without waiting for it (unless timings are synchronised); the learning rate is set.
    pub(crate) fn run(
        &mut self,
        micro_batches: &[(Tensor, Tensor)],
    ) -> Result<(Vec<BatchResult>, StepTimings)> {
        let mut timings = StepTimings::default();
        let k = micro_batches.len();
        let mut results = Vec::with_capacity(k);
        for (i, (images, labels)) in micro_batches.iter().enumerate() {
            if let Some(sync) = self.sync.as_mut() {
                sync.set_require_sync(i + 1 == k);
            }
            results.push(self.forward_backward(images, labels, k, i > 0, &mut timings)?);
        }
        let start = Instant::now();
        if let Some(sync) = self.sync.as_mut() {
            sync.finish(&self.grads)?;
        }
        timings.sync = start.elapsed();

        let start = Instant::now();
        self.optimizer
            .step(self.params.as_ref(), &self.grads, self.model.store())?;
        timings.optimizer = self.lap(start)?;
        if let Some(t) = &self.timeline {
            t.record("optimizer", "optimizer", "compute", start, Instant::now());
        }
        Ok((results, timings))
    }

    /// Forward and backward of one micro-batch; gradients are written (or, when
    /// `accumulate`, added) into the flat gradient buffer. Returns the unscaled mean loss and
    /// the hit count, on the device.
    fn forward_backward(
        &mut self,
        images: &Tensor,
        labels: &Tensor,
        micro_batches: usize,
        accumulate: bool,
        timings: &mut StepTimings,
    ) -> Result<BatchResult> {
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
            let mut written = Vec::new();
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
                    written.push((slot, grad));
                }
                block_params.push(id);
            }
            let values: Vec<(&Slot, &Tensor)> = written.iter().map(|(s, g)| (*s, g)).collect();
            grads.write_many(&values)?;
            if let Some(sync) = sync.as_mut() {
                sync.block_ready(&block_params, grads)?;
            }
            Ok(())
        })?;
        timings.backward += self.lap(start)?;
        let predicted = logits.detach().argmax(D::Minus1)?;
        let hits = predicted
            .eq(&labels.to_dtype(predicted.dtype())?)?
            .to_dtype(DType::U32)?
            .sum_all()?;
        Ok(BatchResult {
            loss: batch_loss.detach(),
            hits,
            samples: labels.elem_count(),
        })
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
