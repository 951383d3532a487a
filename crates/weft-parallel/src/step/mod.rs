//! One optimizer step of a block model under any [`Strategy`], for any [`Objective`]:
//! block-wise forward (the strategy called before each block), the objective's loss,
//! block-wise backward writing gradients into the flat gradient buffer the moment they are
//! final (and telling the strategy, which may start communicating them), then the optimizer
//! over the range of the flat buffers the strategy gives this rank, and the strategy's
//! after-step. A batch can be split into micro-batches whose gradients accumulate before one
//! update. The loss and metrics stay on the device until the update has been issued, so the
//! step itself never waits for the device; on a GPU a whole step can be captured once and
//! replayed as a CUDA graph ([`Trainer::with_cuda_graph`]).

mod batches;
mod buffers;
#[cfg(feature = "cuda")]
mod cuda_graph;
mod delayed_update;
mod launched;
mod master;
mod memory;
mod outcome;
mod reading;
mod run;

use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{DType, Tensor};
use weft_optim::ModelOptimizer;
use weft_precision::{DynamicLossScaler, LossScalerState, ScaleOnDevice};
use weft_tensor::ops::dropout::derive_seed;
use weft_tensor::tape::TapeOptions;
use weft_tensor::{BlockModel, Checkpointing, FlatBuffer, FlatLayout, Mode, Objective, Timeline};

pub use launched::LaunchedStep;
pub use memory::{MemorySample, ModelStateBytes};
pub use outcome::{StepOutcome, StepTimings};
pub use reading::EvalOutcome;

use crate::error::{ParallelError, Result};
use crate::single::SingleProcess;
use crate::strategy::Strategy;
use delayed_update::lost_optimizer;

/// The part of the micro-batches' dropout seeds that sets them apart from the steps' values.
const MICRO_BATCH_SEEDS: u64 = u64::MAX;
pub(crate) use outcome::{outcome, BatchResult};
pub(crate) use run::BackwardSeed;

/// A model with its objective, flat gradients, optimizer (with a flat master copy of the
/// parameters it steps where it needs one) and strategy.
pub struct Trainer {
    /// The captured step, first so that it is dropped first: it holds NCCL operations of
    /// communicators the other fields may own alone (the strategy's, SyncBatchNorm's in the
    /// model), and NCCL's destroy waits until no CUDA graph holds a communicator's operations
    /// (`commDestroySync` polls for them), so a graph dropped after its communicator hangs.
    #[cfg(feature = "cuda")]
    graph: Option<cuda_graph::StepGraph>,
    model: BlockModel,
    objective: Box<dyn Objective>,
    /// The flat master copy of the parameters over the range the optimizer steps
    /// ([`Strategy::optimizer_range`]: all of them, or this rank's ZeRO shard), in host memory;
    /// made when the strategy is set or at the first step, so only the shard is ever read.
    params: Option<Tensor>,
    /// The master copy's dtype, for an optimizer that steps one.
    master_dtype: Option<DType>,
    grads: FlatBuffer,
    /// The optimizer; away (`None`) while a delayed update runs on its thread.
    optimizer: Option<ModelOptimizer>,
    /// The learning rate last set, for an optimizer that was away when it was set.
    lr: Option<f64>,
    /// DeepSpeed's delayed parameter update, when on.
    delayed: Option<delayed_update::DelayedUpdate>,
    options: TapeOptions,
    strategy: Box<dyn Strategy>,
    /// Clip the gradients to this global norm before each update.
    clip_grad_norm: Option<f64>,
    /// Dynamic loss scaling (fp16 training): its configuration and the state it starts from.
    scaler: Option<DynamicLossScaler>,
    /// The scaler's state where the gradients are, made at the first step.
    scale_on_device: Option<ScaleOnDevice>,
    /// The seed every step's dropout masks derive from, and the steps taken so far: micro-batch
    /// `i` of step `s` draws from `(seed, s, i)`, whichever rank or stage computes it — `i`
    /// through the forward's mode, `s` through the step's dropout value, which the device's
    /// masks read from device memory (written before each step and each graph replay).
    dropout_seed: u64,
    steps_taken: u64,
    /// Capturing a CUDA graph: the step's dropout value is written before each replay instead.
    pub(crate) capturing: bool,
    /// Whether a training forward wrote the buffers since [`Self::sync_buffers`] last made
    /// them the same on every rank.
    buffers_written: bool,
    pub(crate) synchronized_timings: bool,
    /// Memory samples of each step, when tracked.
    memory: Option<memory::MemoryTracker>,
}

impl Trainer {
    /// Lays out `model`'s parameters in flat buffers. An optimizer that steps a flat master
    /// copy gets one in its own dtype, in host memory, over the range of the flat buffers it
    /// steps (all of them unless [`Self::with_strategy`] sets another); built for the CPU while the model is
    /// on a GPU, it is offloaded (ZeRO-Offload: gradients copied to the host, the update run
    /// there, the parameters copied back), and the gradients are kept in that dtype too (fp32
    /// master weights and gradients for a 16-bit model: mixed precision, Megatron's
    /// `main_grad`); an optimizer on the parameters' device updates them in place, with
    /// gradients of the model's dtype (fp32 for a 16-bit model, the optimizer keeping fp32
    /// master weights on the device). The strategy is [`SingleProcess`] until
    /// [`Self::with_strategy`].
    pub fn new(
        model: BlockModel,
        objective: Box<dyn Objective>,
        optimizer: ModelOptimizer,
        checkpointing: Checkpointing,
    ) -> Result<Self> {
        let layout = FlatLayout::parameters(model.store());
        let dtype = optimizer.gradient_dtype(model.store().dtype());
        let master_dtype = optimizer.needs_master_copy().then_some(dtype);
        // Allocated once the strategy says which part of it this rank keeps.
        let grads = FlatBuffer::zeros_window(layout, 0..0, dtype, model.store().device())?;
        let strategy = Box::new(SingleProcess::new(&model, false));
        Ok(Self {
            model,
            objective,
            params: None,
            master_dtype,
            grads,
            optimizer: Some(optimizer),
            lr: None,
            delayed: None,
            options: TapeOptions {
                checkpointing,
                ..TapeOptions::default()
            },
            strategy,
            clip_grad_norm: None,
            scaler: None,
            scale_on_device: None,
            dropout_seed: 0,
            steps_taken: 0,
            capturing: false,
            buffers_written: false,
            synchronized_timings: false,
            memory: None,
            #[cfg(feature = "cuda")]
            graph: None,
        })
    }

    /// On a GPU, captures a step into a CUDA graph after a few eager warm-up steps and replays
    /// it for every later batch of the same shape: one launch per step instead of a thousand.
    /// Only under a strategy whose operations can be captured ([`Strategy::capturable`]:
    /// one process, or data parallelism over NCCL, ordered on the device), with the optimizer
    /// on the device (not offloaded). If capturing fails
    /// the trainer says why once and stays eager. Without the `cuda` feature, or on other
    /// devices, nothing changes. Call it after [`Self::with_strategy`].
    ///
    /// ```no_run
    /// # fn demo(trainer: weft_parallel::Trainer, batches: Vec<(candle_core::Tensor, candle_core::Tensor)>)
    /// # -> weft_parallel::Result<()> {
    /// let mut trainer = trainer.with_cuda_graph();
    /// for (inputs, targets) in &batches {
    ///     // Two eager steps, then one capture, then one graph launch per step.
    ///     let outcome = trainer.step(inputs, targets, 0.1)?;
    ///     println!("loss {:.4} (replayed: {})", outcome.loss, outcome.graphed);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
    pub fn with_cuda_graph(mut self) -> Self {
        #[cfg(feature = "cuda")]
        if self.model.store().device().is_cuda()
            && self.strategy.capturable()
            && self.master_dtype.is_none()
        {
            self.graph = Some(cuda_graph::StepGraph::default());
        }
        #[cfg(feature = "cuda")]
        self.strategy.replays_graph(self.graph.is_some());
        self
    }

    /// Spreads the step over ranks with `strategy` (built for this trainer's model and
    /// gradient buffer, after it made the replicas identical). The master copy is read again
    /// from the model, over the range the strategy gives this rank's optimizer.
    /// A strategy that keeps only a shard of the gradients (ZeRO-2/3) gets a gradient buffer of
    /// that shard instead of the whole one.
    pub fn with_strategy(mut self, strategy: Box<dyn Strategy>) -> Result<Self> {
        self.strategy = strategy;
        self.allocate_gradients()?;
        self.reload_master_weights()?;
        Ok(self)
    }

    /// Allocates the flat gradient buffer over the part of it the strategy keeps on this rank
    /// (all of it, or a ZeRO-2/3 shard), unless it holds that part already. Until then it holds
    /// none: a model built as shards never has a whole gradient buffer either.
    pub(crate) fn allocate_gradients(&mut self) -> Result<()> {
        let window = self.strategy.gradient_window(self.grads.layout().len());
        if window != self.grads.window() {
            let (dtype, device) = (self.grads.dtype(), self.grads.tensor().device().clone());
            let layout = self.grads.layout().clone();
            self.grads = FlatBuffer::zeros_window(layout, window, dtype, &device)?;
        }
        Ok(())
    }

    /// Clips the gradients to the global norm `max_norm` before every update
    /// ([`crate::clip_grad_norm`]); each step then reports the norm before clipping as the
    /// metric `grad_norm`.
    pub fn with_clip_grad_norm(mut self, max_norm: f64) -> Result<Self> {
        if !(max_norm.is_finite() && max_norm > 0.0) {
            return Err(ParallelError::Config(format!(
                "the clipping norm must be finite and > 0, not {max_norm}"
            )));
        }
        self.clip_grad_norm = Some(max_norm);
        Ok(self)
    }

    /// Scales the loss with `scaler` before backward and unscales the gradients before the
    /// update (and before clipping); a step whose gradients hold an inf or NaN on any rank is
    /// skipped by every rank ([`Strategy::reduce_found_inf`]) and the scale lowered. The
    /// scaler's state lives on the gradients' device ([`ScaleOnDevice`]) and the optimizer
    /// skips on the device, so the step needs no host read and a CUDA graph captures it.
    pub fn with_loss_scaler(mut self, scaler: DynamicLossScaler) -> Self {
        self.scaler = Some(scaler);
        self.scale_on_device = None;
        self
    }

    /// The loss scaler's state (scale, growth tracker, skipped steps) after the last step, if
    /// the step scales the loss (read from the device).
    pub fn loss_scaler_state(&self) -> Result<Option<LossScalerState>> {
        match (&self.scale_on_device, &self.scaler) {
            (Some(on_device), _) => Ok(Some(on_device.read()?.0)),
            (None, Some(scaler)) => Ok(Some(scaler.state().clone())),
            (None, None) => Ok(None),
        }
    }

    /// Restores the loss scaler's state (resuming a run); without a scaler nothing changes.
    pub fn load_loss_scaler_state(&mut self, state: &LossScalerState) -> Result<()> {
        if let Some(scaler) = self.scaler.as_mut() {
            scaler.load_state(state.clone())?;
        }
        if let Some(on_device) = &self.scale_on_device {
            on_device.load(state)?;
        }
        Ok(())
    }

    /// The scaler's state on the gradients' device, made from the scaler at the first step.
    pub(crate) fn make_scale_on_device(&mut self) -> Result<()> {
        if let (Some(scaler), None) = (&self.scaler, &self.scale_on_device) {
            let device = self.model.store().device().clone();
            self.scale_on_device = Some(ScaleOnDevice::new(scaler, &device)?);
        }
        Ok(())
    }

    /// Optimizer steps taken so far (what each step's dropout masks derive from).
    pub fn steps_taken(&self) -> u64 {
        self.steps_taken
    }

    /// Continues as if `steps` steps had been taken (a resumed run: the next step's dropout
    /// masks are those of step `steps`).
    pub fn resume_at_step(&mut self, steps: u64) {
        self.steps_taken = steps;
    }

    /// Derives every step's dropout masks from `seed` (default 0): micro-batch `i` of step `s`
    /// draws the same masks on every rank and stage that computes it.
    pub fn with_dropout_seed(mut self, seed: u64) -> Self {
        self.dropout_seed = seed;
        self
    }

    /// The dropout seed of micro-batch `micro` (of every step: the step enters through
    /// [`Self::dropout_step`]).
    pub(crate) fn micro_batch_seed(&self, micro: usize) -> u64 {
        derive_seed(
            derive_seed(self.dropout_seed, MICRO_BATCH_SEEDS),
            micro as u64,
        )
    }

    /// Step `step`'s dropout value, mixed into each of its masks.
    pub(crate) fn dropout_step(&self, step: u64) -> u64 {
        derive_seed(self.dropout_seed, step)
    }

    /// Writes step `step`'s dropout value on the model's device, ordered before the work
    /// queued next (the step run eagerly, or its replay).
    pub(crate) fn write_dropout_step(&self, step: u64) -> Result<()> {
        let device = self.model.store().device();
        Ok(weft_tensor::ops::set_dropout_step(
            device,
            self.dropout_step(step),
        )?)
    }

    /// Trains in `mode` (e.g. BatchNorm with running statistics for exact-equivalence tests).
    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.options.mode = mode;
        self
    }

    /// Records forward, backward and optimizer spans on `timeline`.
    pub fn with_timeline(mut self, timeline: Arc<Timeline>) -> Self {
        self.options.timeline = Some(timeline);
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
    pub(crate) fn lap(&self, start: Instant) -> Result<Duration> {
        if self.synchronized_timings {
            self.model.store().device().synchronize()?;
        }
        Ok(start.elapsed())
    }

    pub fn model(&self) -> &BlockModel {
        &self.model
    }

    pub fn strategy(&self) -> &dyn Strategy {
        self.strategy.as_ref()
    }

    /// The flat gradient buffer (its layout is the parameters' layout).
    pub fn grads(&self) -> &FlatBuffer {
        &self.grads
    }

    /// The objective the last block's output is scored with.
    pub(crate) fn objective(&self) -> &dyn Objective {
        self.objective.as_ref()
    }
}
