//! A training step replayed from a CUDA graph ([`super::Trainer::with_cuda_graph`]), on
//! one GPU or on each GPU of a data-parallel job whose collectives are ordered on the device
//! (NCCL inside the graph).
//!
//! The step is host-bound: about a thousand kernel launches and allocations, each costing the
//! host more than the device. After [`WARMUP`] eager steps (which choose the cuDNN algorithms
//! and fill Candle's cache of kernel parameters that would otherwise be uploaded from the
//! host), one step on static input buffers is captured into a graph, with its allocations as
//! graph memory nodes; every later batch is copied into those buffers and the graph launched
//! once. The learning rate is read by the optimizer kernel from device memory, so schedules
//! keep working. Anything the capture cannot take (a host copy, a batch of another shape) makes
//! the trainer run eagerly instead, saying so once.
//!
//! A replay can also be queued and read later ([`StepGraph::queue`], [`StepGraph::finish`]):
//! its results are copied into one of two pinned host slots behind it on the stream, and the
//! strategy's fence is recorded, so that the next step is launched before this one is read and
//! the device goes from one replay to the next without waiting for the host.

use candle_core::cuda_backend::cudarc::driver::sys::{
    CUgraphInstantiate_flags, CUstreamCaptureMode,
};
use candle_core::cuda_backend::cudarc::driver::CudaGraph;
use candle_core::{DType, Device, Tensor};
use weft_collectives::Work;
use weft_tensor::flat::HostStaging;
use weft_tensor::ops::cuda_launch::device_address;
use weft_tensor::ops::{copy_tensors, is_channels_last};

use super::outcome::{outcome, BatchResult, StepOutcome, StepTimings};
use super::Trainer;
use crate::error::{ParallelError, Result};

fn cuda_error(what: &str, e: impl std::fmt::Debug) -> ParallelError {
    ParallelError::CudaGraph(format!("{what}: {e:?}"))
}

/// Eager steps before the capture.
pub const WARMUP: usize = 2;

/// The static buffers a captured step reads and writes.
struct Buffers {
    inputs: Tensor,
    targets: Tensor,
    /// The step's scalar results in f64 (as an eager step reads them), read back in one copy:
    /// the loss, then each metric.
    outputs: Tensor,
    /// The metrics' names, as a warm-up step reported them.
    metric_names: Vec<&'static str>,
}

impl Buffers {
    fn fits(&self, inputs: &Tensor, targets: &Tensor) -> bool {
        inputs.shape() == self.inputs.shape()
            && targets.shape() == self.targets.shape()
            && inputs.dtype() == self.inputs.dtype()
            && targets.dtype() == self.targets.dtype()
            && is_channels_last(inputs) == is_channels_last(&self.inputs)
    }

    /// The batch's values, in the static input buffers (device-to-device copies, but for a
    /// tensor that is its buffer: written there already, see [`StepGraph::input_buffers`]).
    /// Channels-last images (whose buffer is channels-last too) travel as their NHWC storage.
    fn load(&self, inputs: &Tensor, targets: &Tensor) -> Result<()> {
        let storage_order = |t: &Tensor| match is_channels_last(t) {
            true => t.permute((0, 2, 3, 1)),
            false => Ok(t.clone()),
        };
        let (inputs, buffer) = (storage_order(inputs)?, storage_order(&self.inputs)?);
        let mut pairs = Vec::with_capacity(2);
        for (value, buffer) in [(&inputs, &buffer), (targets, &self.targets)] {
            if !is_buffer(value, buffer)? {
                pairs.push((value, buffer));
            }
        }
        copy_tensors(&pairs)?;
        Ok(())
    }
}

/// Whether `value` is `buffer` itself: the same elements of the same storage.
fn is_buffer(value: &Tensor, buffer: &Tensor) -> Result<bool> {
    if value.shape() != buffer.shape() || value.dtype() != buffer.dtype() {
        return Ok(false);
    }
    let contiguous = value.is_contiguous() && buffer.is_contiguous();
    Ok(contiguous && device_address(value)? == device_address(buffer)?)
}

enum State {
    /// Eager steps taken so far.
    WarmingUp(usize),
    Ready(CudaGraph),
    /// Capturing failed: eager from now on.
    Off,
}

/// Replays queued and not yet finished, at most.
const QUEUED_SLOTS: usize = 2;

/// The capture state of one trainer.
pub struct StepGraph {
    state: State,
    buffers: Option<Buffers>,
    /// The graph's memory went back to the device for eager work since the last launch.
    released: bool,
    /// Where queued replays' outputs are copied (pinned host memory), and which slots hold a
    /// replay not yet finished.
    results: [HostStaging<f64>; QUEUED_SLOTS],
    taken: [bool; QUEUED_SLOTS],
}

impl Default for StepGraph {
    fn default() -> Self {
        Self {
            state: State::WarmingUp(0),
            buffers: None,
            released: false,
            results: Default::default(),
            taken: [false; QUEUED_SLOTS],
        }
    }
}

/// A replay queued on the device ([`StepGraph::queue`]), read by [`StepGraph::finish`].
pub struct QueuedReplay {
    slot: usize,
    /// The strategy's fence right behind the replay (the watched wait for its collectives).
    fence: Option<Work<()>>,
    samples: usize,
}

impl StepGraph {
    /// Before eager work between replays (evaluation): the captured step's temporaries go
    /// back to the device, so that the eager pass does not hold its memory beside theirs.
    /// Once per pause; the next launch maps them again, after the eager pool has returned
    /// what it cached.
    pub fn release_for_eager_work(&mut self, device: &Device) -> Result<()> {
        if matches!(self.state, State::Ready(_)) && !self.released {
            weft_tensor::cuda_runtime::release_graph_memory(device)?;
            self.released = true;
        }
        Ok(())
    }

    /// One step of `trainer` on the batch: eager while warming up, then captured once and
    /// replayed; `meanwhile` runs on the host once the step is queued, before its results are
    /// read.
    pub fn step(
        &mut self,
        trainer: &mut Trainer,
        (inputs, targets, lr): (&Tensor, &Tensor, f64),
        meanwhile: &mut dyn FnMut(),
    ) -> Result<StepOutcome> {
        if self.buffers.is_none() {
            self.buffers = Some(Buffers {
                inputs: inputs.copy()?,
                targets: targets.copy()?,
                outputs: Tensor::zeros(1, DType::F64, inputs.device())?,
                metric_names: Vec::new(),
            });
        }
        let buffers = self.buffers.as_mut().expect("made above");
        if matches!(self.state, State::Off) || !buffers.fits(inputs, targets) {
            let batch = [(inputs.clone(), targets.clone())];
            return trainer.step_accumulated_then(&batch, lr, meanwhile);
        }
        if matches!(self.state, State::Ready(_)) {
            let queued = self.queue(trainer, (inputs, targets, lr))?;
            meanwhile();
            return self.finish(queued);
        }
        let cuda = inputs.device().as_cuda_device()?.clone();
        trainer.set_lr(lr)?;
        buffers.load(inputs, targets)?;
        let batch = [(buffers.inputs.clone(), buffers.targets.clone())];
        match &self.state {
            State::WarmingUp(done) if *done < WARMUP => {
                let _cache = cuda.enable_cuda_graph_htod_cache();
                let (results, timings) = trainer.run(&batch)?;
                meanwhile();
                trainer.wait_for_device()?;
                self.state = State::WarmingUp(done + 1);
                // The static outputs, outside the graph's memory pool.
                let names: Vec<_> = results[0].metrics.iter().map(|(name, _)| *name).collect();
                let len = 1 + names.len();
                buffers.outputs = Tensor::zeros(len, DType::F64, inputs.device())?;
                buffers.metric_names = names;
                outcome(&results, timings)
            }
            State::WarmingUp(_) => {
                let _cache = cuda.enable_cuda_graph_htod_cache();
                // The warm-up steps' freed memory, cached by the pool, back to the device
                // before the graph maps its own: else the device holds both at the capture.
                weft_tensor::cuda_runtime::release_cached_memory(inputs.device())?;
                match capture(trainer, &batch, buffers, inputs.device()) {
                    Ok(graph) => {
                        // The captured step counted itself: this launch runs it.
                        trainer.write_dropout_step(trainer.steps_taken - 1)?;
                        graph.launch().map_err(|e| cuda_error("graph launch", e))?;
                        meanwhile();
                        trainer.wait_for_device()?;
                        // What the capture itself left cached in the pool, likewise: the
                        // graph allocates from its own.
                        weft_tensor::cuda_runtime::release_cached_memory(inputs.device())?;
                        // One sample of the captured step (replays take none): its memory is
                        // the graph's own.
                        trainer.record_memory("captured", 0)?;
                        self.state = State::Ready(graph);
                        read(buffers, trainer, targets)
                    }
                    Err(reason) => {
                        tracing::warn!("the training step runs without a CUDA graph ({reason})");
                        self.state = State::Off;
                        trainer.strategy.replays_graph(false);
                        let (results, timings) = trainer.run(&batch)?;
                        meanwhile();
                        trainer.wait_for_device()?;
                        outcome(&results, timings)
                    }
                }
            }
            State::Ready(_) | State::Off => unreachable!("handled above"),
        }
    }

    /// The captured step's static input buffers (inputs, targets), once it replays: the next
    /// batch may be written into them directly, once the step before it is queued (the device
    /// runs that write after the replay that reads the buffers), and then handed to the next
    /// step as its batch, which then copies nothing.
    pub fn input_buffers(&self) -> Option<(Tensor, Tensor)> {
        match (&self.state, &self.buffers) {
            (State::Ready(_), Some(b)) => Some((b.inputs.clone(), b.targets.clone())),
            _ => None,
        }
    }

    /// Whether the step on this batch would be a replay ([`Self::queue`] takes it).
    pub fn replays(&self, inputs: &Tensor, targets: &Tensor) -> bool {
        matches!(self.state, State::Ready(_))
            && self
                .buffers
                .as_ref()
                .is_some_and(|b| b.fits(inputs, targets))
    }

    /// Queues a replay of the captured step on the batch and returns without waiting for the
    /// device: the learning rate and the batch written into the static buffers behind the
    /// work queued before (so a replay still running reads its own), the graph launched, its
    /// outputs copied into a free host slot and the strategy's fence recorded behind it.
    pub fn queue(
        &mut self,
        trainer: &mut Trainer,
        (inputs, targets, lr): (&Tensor, &Tensor, f64),
    ) -> Result<QueuedReplay> {
        let (State::Ready(graph), Some(buffers)) = (&self.state, &self.buffers) else {
            return Err(ParallelError::CudaGraph(
                "no captured step to replay".into(),
            ));
        };
        let slot = self.taken.iter().position(|taken| !taken).ok_or_else(|| {
            ParallelError::Config(format!(
                "{QUEUED_SLOTS} launched steps are unfinished: finish the oldest before \
                 launching another"
            ))
        })?;
        trainer.set_lr(lr)?;
        buffers.load(inputs, targets)?;
        if std::mem::take(&mut self.released) {
            weft_tensor::cuda_runtime::release_cached_memory(inputs.device())?;
        }
        // The replay as one span (its blocks record nothing), on the device's clock: it ends
        // where the replay does on the stream.
        let timeline = trainer.options.timeline.as_ref();
        let span = timeline.map(|t| t.open("cuda graph launch", "graph", "compute"));
        trainer.note_replayed_forward();
        // The replay draws this step's dropout masks; the host counts the step it runs.
        trainer.write_dropout_step(trainer.steps_taken)?;
        trainer.steps_taken += 1;
        graph.launch().map_err(|e| cuda_error("graph launch", e))?;
        let len = buffers.outputs.elem_count();
        self.results[slot].queue_download(&buffers.outputs, 0..len)?;
        if let Some(span) = span {
            span.close();
        }
        let fence = trainer.strategy.device_fence()?;
        self.taken[slot] = true;
        Ok(QueuedReplay {
            slot,
            fence,
            samples: trainer.objective.samples(targets),
        })
    }

    /// The outcome of a queued replay, once the device has run it (the strategy's watched
    /// wait first: a dead peer is an error, not a hang).
    pub fn finish(&mut self, queued: QueuedReplay) -> Result<StepOutcome> {
        self.taken[queued.slot] = false;
        if let Some(fence) = queued.fence {
            fence.wait()?;
        }
        let values = self.results[queued.slot].as_slice()?;
        let names = self.buffers.as_ref().map_or(&[][..], |b| &b.metric_names);
        Ok(replayed_outcome(values, names, queued.samples))
    }
}

/// Captures one step on the static buffers, its loss and metrics copied into the outputs.
fn capture(
    trainer: &mut Trainer,
    batch: &[(Tensor, Tensor)],
    buffers: &mut Buffers,
    device: &Device,
) -> Result<CudaGraph> {
    let stream = device.as_cuda_device()?.cuda_stream();
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(|e| cuda_error("begin capture", e))?;
    // Waiting for the device is not allowed while capturing, nor reading the memory pool's
    // use (the memory tracker's samples).
    let synchronized = std::mem::replace(&mut trainer.synchronized_timings, false);
    let tracker = trainer.memory.take();
    // The step's dropout value is written before each launch, outside the graph.
    trainer.capturing = true;
    let body = (|| -> Result<()> {
        let (results, _) = trainer.run(batch)?;
        let result: &BatchResult = &results[0];
        let names: Vec<_> = result.metrics.iter().map(|(name, _)| *name).collect();
        if names != buffers.metric_names {
            return Err(ParallelError::CudaGraph(format!(
                "the objective reported the metrics {names:?}, not {:?} as in the warm-up steps",
                buffers.metric_names
            )));
        }
        let values = std::iter::once(&result.loss)
            .chain(result.metrics.iter().map(|(_, value)| value))
            .map(|value| Ok(value.to_dtype(DType::F64)?.reshape(())?))
            .collect::<Result<Vec<_>>>()?;
        copy_tensors(&[(&Tensor::stack(&values, 0)?, &buffers.outputs)])?;
        Ok(())
    })();
    trainer.synchronized_timings = synchronized;
    trainer.memory = tracker;
    trainer.capturing = false;
    // The capture ends whatever happened, so that the stream is usable again.
    // Node priorities honoured: NCCL's kernels keep their stream's (see `NcclConfig`).
    let graph =
        stream.end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY);
    // Errors recorded by cudarc while capturing (e.g. an invalidated capture) are this
    // capture's; clear them so that later eager work does not report them.
    let recorded = stream.context().check_err();
    body?;
    recorded.map_err(|e| cuda_error("while capturing", e))?;
    graph
        .map_err(|e| cuda_error("end capture", e))?
        .ok_or_else(|| ParallelError::CudaGraph("the capture recorded no work".into()))
}

/// The outcome of the captured step's first replay: its loss and metrics, read from the
/// static outputs in one copy.
fn read(buffers: &Buffers, trainer: &Trainer, targets: &Tensor) -> Result<StepOutcome> {
    let values = buffers.outputs.to_vec1::<f64>()?;
    let samples = trainer.objective.samples(targets);
    Ok(replayed_outcome(&values, &buffers.metric_names, samples))
}

/// A replayed step's outcome from its outputs: the loss, then each metric of `names`.
fn replayed_outcome(values: &[f64], names: &[&'static str], samples: usize) -> StepOutcome {
    let metrics = names
        .iter()
        .zip(&values[1..])
        .map(|(name, value)| (*name, *value))
        .collect();
    StepOutcome {
        loss: values[0],
        samples,
        metrics,
        timings: StepTimings::default(),
        graphed: true,
        loss_scale: None,
        skipped: false,
    }
}
