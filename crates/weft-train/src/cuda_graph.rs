//! A training step replayed from a CUDA graph ([`crate::step::Trainer::with_cuda_graph`]), on
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

use anyhow::{anyhow, Result};
use candle_core::cuda_backend::cudarc::driver::sys::{
    CUgraphInstantiate_flags, CUstreamCaptureMode,
};
use candle_core::cuda_backend::cudarc::driver::CudaGraph;
use candle_core::{Device, Tensor};
use weft_tensor::ops::copy_tensors;

use crate::step::{outcome, BatchResult, StepOutcome, StepTimings, Trainer};

/// Eager steps before the capture.
pub const WARMUP: usize = 2;

/// The static buffers a captured step reads and writes.
struct Buffers {
    images: Tensor,
    labels: Tensor,
    loss: Tensor,
    hits: Tensor,
}

impl Buffers {
    fn fits(&self, images: &Tensor, labels: &Tensor) -> bool {
        images.shape() == self.images.shape()
            && labels.shape() == self.labels.shape()
            && images.dtype() == self.images.dtype()
            && labels.dtype() == self.labels.dtype()
    }

    /// The batch's values, in the static input buffers (device-to-device copies).
    fn load(&self, images: &Tensor, labels: &Tensor) -> Result<()> {
        copy_tensors(&[(images, &self.images), (labels, &self.labels)])?;
        Ok(())
    }
}

enum State {
    /// Eager steps taken so far.
    WarmingUp(usize),
    Ready(CudaGraph),
    /// Capturing failed: eager from now on.
    Off,
}

/// The capture state of one trainer.
pub struct StepGraph {
    state: State,
    buffers: Option<Buffers>,
}

impl Default for StepGraph {
    fn default() -> Self {
        Self {
            state: State::WarmingUp(0),
            buffers: None,
        }
    }
}

impl StepGraph {
    /// One step of `trainer` on the batch: eager while warming up, then captured once and
    /// replayed.
    pub fn step(
        &mut self,
        trainer: &mut Trainer,
        images: &Tensor,
        labels: &Tensor,
        lr: f64,
    ) -> Result<StepOutcome> {
        if self.buffers.is_none() {
            self.buffers = Some(Buffers {
                images: images.copy()?,
                labels: labels.copy()?,
                loss: Tensor::zeros((), candle_core::DType::F32, images.device())?,
                hits: Tensor::zeros((), candle_core::DType::U32, images.device())?,
            });
        }
        let buffers = self.buffers.as_ref().expect("made above");
        if matches!(self.state, State::Off) || !buffers.fits(images, labels) {
            return trainer.step_accumulated(&[(images.clone(), labels.clone())], lr);
        }
        let cuda = images.device().as_cuda_device()?.clone();
        trainer.optimizer_mut().set_lr(lr)?;
        buffers.load(images, labels)?;
        let batch = [(buffers.images.clone(), buffers.labels.clone())];
        match &self.state {
            State::WarmingUp(done) if *done < WARMUP => {
                let _cache = cuda.enable_cuda_graph_htod_cache();
                let (results, timings) = trainer.run(&batch)?;
                trainer.wait_for_device()?;
                self.state = State::WarmingUp(done + 1);
                outcome(&results, timings)
            }
            State::WarmingUp(_) => {
                let _cache = cuda.enable_cuda_graph_htod_cache();
                match capture(trainer, &batch, buffers, images.device()) {
                    Ok(graph) => {
                        graph
                            .launch()
                            .map_err(|e| anyhow!("CUDA graph launch: {e:?}"))?;
                        trainer.wait_for_device()?;
                        // The warm-up steps' freed memory, cached by the pool, is not needed
                        // any more: the graph allocates from its own.
                        weft_tensor::cuda_runtime::release_cached_memory(images.device())?;
                        self.state = State::Ready(graph);
                        read(buffers, labels)
                    }
                    Err(reason) => {
                        eprintln!("weft: the training step runs without a CUDA graph ({reason:#})");
                        self.state = State::Off;
                        let (results, timings) = trainer.run(&batch)?;
                        trainer.wait_for_device()?;
                        outcome(&results, timings)
                    }
                }
            }
            State::Ready(graph) => {
                graph
                    .launch()
                    .map_err(|e| anyhow!("CUDA graph launch: {e:?}"))?;
                trainer.wait_for_device()?;
                read(buffers, labels)
            }
            State::Off => unreachable!("handled above"),
        }
    }
}

/// Captures one step on the static buffers, its loss and hit count copied into theirs.
fn capture(
    trainer: &mut Trainer,
    batch: &[(Tensor, Tensor)],
    buffers: &Buffers,
    device: &Device,
) -> Result<CudaGraph> {
    let stream = device.as_cuda_device()?.cuda_stream();
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(|e| anyhow!("begin capture: {e:?}"))?;
    // Waiting for the device is not allowed while capturing.
    let synchronized = std::mem::replace(&mut trainer.synchronized_timings, false);
    let body = (|| -> Result<()> {
        let (results, _) = trainer.run(batch)?;
        let result: &BatchResult = &results[0];
        let loss = result.loss.to_dtype(candle_core::DType::F32)?;
        copy_tensors(&[(&loss, &buffers.loss), (&result.hits, &buffers.hits)])?;
        Ok(())
    })();
    trainer.synchronized_timings = synchronized;
    // The capture ends whatever happened, so that the stream is usable again.
    let graph = stream.end_capture(CUgraphInstantiate_flags(0));
    // Errors recorded by cudarc while capturing (e.g. an invalidated capture) are this
    // capture's; clear them so that later eager work does not report them.
    let recorded = stream.context().check_err();
    body?;
    recorded.map_err(|e| anyhow!("while capturing: {e:?}"))?;
    graph
        .map_err(|e| anyhow!("end capture: {e:?}"))?
        .ok_or_else(|| anyhow!("the capture recorded no work"))
}

/// The outcome of a replayed step: its loss and hit count, read from the static buffers.
fn read(buffers: &Buffers, labels: &Tensor) -> Result<StepOutcome> {
    let result = BatchResult {
        loss: buffers.loss.clone(),
        hits: buffers.hits.clone(),
        samples: labels.elem_count(),
    };
    let mut out = outcome(&[result], StepTimings::default())?;
    out.graphed = true;
    Ok(out)
}
