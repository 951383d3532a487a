//! What one training step measured: its phases' times, and its loss and metrics, read from
//! the device only once the step has been issued.

use std::time::Duration;

use candle_core::{DType, Tensor};

use crate::error::{ParallelError, Result};

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
#[derive(Debug, Clone)]
pub struct StepOutcome {
    /// Mean loss over this rank's samples, before the update.
    pub loss: f64,
    /// Samples (as the objective counts them) the loss averages over.
    pub samples: usize,
    /// The objective's metrics summed over this rank's samples, e.g. `correct`; with gradient
    /// clipping also `grad_norm`, the global gradient norm before clipping.
    pub metrics: Vec<(&'static str, f64)>,
    /// The phases' times; all zero for a step replayed from a CUDA graph (one launch).
    pub timings: StepTimings,
    /// Whether the step was replayed from a CUDA graph.
    pub graphed: bool,
    /// The loss scale after the step (with a loss scaler).
    pub loss_scale: Option<f64>,
    /// Whether the loss scaler skipped the update (an inf or NaN gradient on some rank).
    pub skipped: bool,
}

impl StepOutcome {
    /// The summed metric called `name` (0 if the objective reports no such metric).
    pub fn metric(&self, name: &str) -> f64 {
        self.find_metric(name).unwrap_or(0.0)
    }

    fn find_metric(&self, name: &str) -> Option<f64> {
        self.metrics
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    }

    /// The step's loss summed over the samples of every data-parallel replica, and their
    /// count, where the strategy summed them on the device within the step (`None` for a
    /// single replica, or a strategy that has no replicas to sum over).
    pub fn replicas_loss_sum(&self) -> Option<[f64; 2]> {
        Some([
            self.find_metric(REPLICAS_LOSS_SUM)?,
            self.find_metric(REPLICAS_SAMPLES)?,
        ])
    }
}

/// The metric names under which the last micro-batch carries the step's loss sum and sample
/// count over the replicas ([`StepOutcome::replicas_loss_sum`]).
pub(crate) const REPLICAS_LOSS_SUM: &str = "replicas_loss_sum";
pub(crate) const REPLICAS_SAMPLES: &str = "replicas_samples";

/// This rank's loss summed over its samples and their count, as a two-element tensor on the
/// device (f64 for an f64 loss, else f32), from its micro-batches' mean losses (no host copy:
/// a CUDA graph captures it).
pub(crate) fn local_loss_sum(results: &[BatchResult]) -> Result<Tensor> {
    let mut sum: Option<Tensor> = None;
    let mut samples = 0;
    for r in results {
        let dtype = match r.loss.dtype() {
            DType::F64 => DType::F64,
            _ => DType::F32,
        };
        let part = r.loss.to_dtype(dtype)?.affine(r.samples as f64, 0.0)?;
        sum = Some(match sum {
            Some(s) => (s + part)?,
            None => part,
        });
        samples += r.samples;
    }
    let sum = sum.ok_or_else(|| ParallelError::Config("a step without micro-batches".into()))?;
    let count = sum.zeros_like()?.affine(1.0, samples as f64)?;
    Ok(Tensor::stack(&[sum, count], 0)?)
}

/// One micro-batch's mean loss and metric sums, still on the device.
pub(crate) struct BatchResult {
    pub loss: Tensor,
    pub metrics: Vec<(&'static str, Tensor)>,
    pub samples: usize,
}

/// Reads a scalar of any dtype as f64 (waits for the device).
fn scalar(t: &Tensor) -> Result<f64> {
    Ok(t.to_dtype(DType::F64)?.to_scalar::<f64>()?)
}

/// The outcome of the micro-batches `results` of one step, read from the device.
pub(crate) fn outcome(results: &[BatchResult], timings: StepTimings) -> Result<StepOutcome> {
    let (mut loss_sum, mut samples) = (0.0, 0);
    let mut metrics: Vec<(&'static str, f64)> = Vec::new();
    for r in results {
        loss_sum += scalar(&r.loss)? * r.samples as f64;
        samples += r.samples;
        for (name, value) in &r.metrics {
            let value = scalar(value)?;
            match metrics.iter_mut().find(|(n, _)| n == name) {
                Some((_, sum)) => *sum += value,
                None => metrics.push((name, value)),
            }
        }
    }
    Ok(StepOutcome {
        loss: loss_sum / samples.max(1) as f64,
        samples,
        metrics,
        timings,
        graphed: false,
        loss_scale: None,
        skipped: false,
    })
}
