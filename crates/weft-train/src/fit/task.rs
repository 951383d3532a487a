//! What a task brings to the training loop ([`super::fit`]): its samples and their batches on
//! the device, the sums a step adds to its epoch, its evaluation and the export of the final
//! model. ResNet classification and GPT next-token prediction are two tasks; a third family
//! brings its own [`Task`] and uses the same loop.

use anyhow::Result;
use candle_core::Tensor;
use weft_parallel::StepOutcome;

use super::stepper::Stepper;
use super::FitSummary;
use crate::distributed::RankContext;
use crate::run_dir::RunFolder;

/// What a task's steps are counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Throughput {
    /// Images per second (`images_per_sec`, `img/s`).
    Images,
    /// Tokens per second (`tokens_per_sec`, `tok/s`), each sample `seq_len` tokens.
    Tokens { seq_len: usize },
}

impl Throughput {
    /// Items (images, tokens) in one sample.
    pub fn per_sample(self) -> usize {
        match self {
            Throughput::Images => 1,
            Throughput::Tokens { seq_len } => seq_len,
        }
    }

    /// The progress bar's unit.
    pub fn unit(self) -> &'static str {
        match self {
            Throughput::Images => "img/s",
            Throughput::Tokens { .. } => "tok/s",
        }
    }
}

/// One epoch's batches on this rank, in order.
pub trait Batches {
    /// The next batch on the device, written into `into` (the captured step's input buffer)
    /// where the task can; `Ok(None)` on a rank that reads no batch (a pipeline's middle stage);
    /// `None` at the epoch's end.
    fn next_batch(&mut self, into: Option<&Tensor>) -> Option<Result<Option<(Tensor, Tensor)>>>;

    /// Samples replaced so far for being undecodable or oversized (with a skip policy).
    fn skipped_samples(&self) -> usize {
        0
    }
}

/// The validation set's metrics, over every rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    pub loss: f64,
    /// The fraction of correct predictions, for a task that has them.
    pub accuracy: Option<f64>,
}

/// A task the loop trains.
pub trait Task {
    /// What its steps are counted in.
    fn throughput(&self) -> Throughput;

    /// The batches of `epoch` over `indices` (the epoch's samples not yet trained on), each
    /// `batch` samples; a rank that reads none (`reads` false) gets `Ok(None)` for each.
    fn batches(
        &mut self,
        indices: Vec<usize>,
        epoch_batch_reads: (usize, usize, bool),
    ) -> Result<Box<dyn Batches>>;

    /// How many sums a step adds to (their layout the task's own, kept by checkpoints for a
    /// resumed epoch).
    fn totals_len(&self) -> usize;

    /// Adds a finished step to this rank's sums over the epoch.
    fn accumulate(&self, totals: &mut [f64], outcome: &StepOutcome);

    /// The epoch's training loss and accuracy (if the task has one) from the sums over every
    /// rank.
    fn train_metrics(&self, totals: &[f64]) -> (f64, Option<f64>);

    /// The metrics over the validation set, in evaluation mode (a collective over the job).
    fn evaluate(&mut self, stepper: &mut Stepper, ctx: &RankContext) -> Result<Evaluation>;

    /// The synthetic data's best achievable loss, when the task knows it.
    fn loss_floor(&self) -> Option<f64> {
        None
    }

    /// Writes the final model into `run`'s folder (a collective over the job: sharded and
    /// split parameters are gathered first).
    fn export(
        &mut self,
        stepper: &mut Stepper,
        run: &RunFolder,
        summary: &FitSummary,
    ) -> Result<()>;
}
