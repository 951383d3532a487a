//! Next-token prediction as a task of the loop: this replica's shard of the token windows,
//! each batch built on the device (on a pipeline's first and last stage: the inputs and the
//! targets; a middle stage reads none), the loss and samples summed per epoch, the validation
//! loss, and the final model gathered whole (from ZeRO-3 shards, tensor-parallel slices and
//! pipeline stages) and written with Hugging Face's names.

use std::sync::Arc;

use anyhow::Result;
use candle_core::{Device, Tensor};
use weft_data::TokenWindows;
use weft_parallel::StepOutcome;

use crate::distributed::RankContext;
use crate::fit::{Batches, Evaluation, FitSummary, Stepper, Task, Throughput};
use crate::gpt_data::TokenData;
use crate::gpt_parallel::{GptMesh, TensorParallelLayers};
use crate::gpt_parts::{export, validate};
use crate::language_model::LanguageModel;
use crate::run_dir::RunFolder;

/// A language model's task.
pub struct NextToken<'a> {
    pub train: Arc<TokenWindows>,
    pub val: TokenWindows,
    pub loss_floor: Option<f64>,
    pub seq_len: usize,
    /// Sequences per step on this replica, and the micro-batches they are split into.
    pub local_batch: usize,
    pub micro_batches: usize,
    pub device: Device,
    pub mesh: &'a GptMesh,
    pub split_layers: &'a Option<std::sync::Arc<TensorParallelLayers>>,
    pub config: &'a LanguageModel,
    /// The step this invocation started from (the export's log line).
    pub start: usize,
}

impl<'a> NextToken<'a> {
    /// The task over `data` (windows of `seq_len` tokens) for a model of `config` on `device`,
    /// this replica's shard of the windows as `sampler` cuts them.
    pub fn new(
        data: TokenData,
        seq_len: usize,
        (local_batch, micro_batches): (usize, usize),
        device: &Device,
        (mesh, split_layers, config): (
            &'a GptMesh,
            &'a Option<std::sync::Arc<TensorParallelLayers>>,
            &'a LanguageModel,
        ),
        start: usize,
    ) -> Self {
        Self {
            train: Arc::new(data.train),
            val: data.val,
            loss_floor: data.loss_floor,
            seq_len,
            local_batch,
            micro_batches,
            device: device.clone(),
            mesh,
            split_layers,
            config,
            start,
        }
    }
}

/// An epoch's batches: the windows' chunks, built on the device as they are taken.
struct WindowBatches {
    windows: Arc<TokenWindows>,
    chunks: std::vec::IntoIter<Vec<usize>>,
    device: Device,
    reads: bool,
}

impl Batches for WindowBatches {
    fn next_batch(&mut self, _into: Option<&Tensor>) -> Option<Result<Option<(Tensor, Tensor)>>> {
        let chunk = self.chunks.next()?;
        Some(match self.reads {
            true => self
                .windows
                .batch(&chunk, &self.device)
                .map(Some)
                .map_err(anyhow::Error::from),
            false => Ok(None),
        })
    }
}

impl Task for NextToken<'_> {
    fn throughput(&self) -> Throughput {
        Throughput::Tokens {
            seq_len: self.seq_len,
        }
    }

    fn batches(
        &mut self,
        indices: Vec<usize>,
        (_epoch, batch, reads): (usize, usize, bool),
    ) -> Result<Box<dyn Batches>> {
        let chunks: Vec<Vec<usize>> = indices.chunks_exact(batch).map(<[usize]>::to_vec).collect();
        Ok(Box::new(WindowBatches {
            windows: self.train.clone(),
            chunks: chunks.into_iter(),
            device: self.device.clone(),
            reads,
        }))
    }

    fn totals_len(&self) -> usize {
        2
    }

    /// This rank's loss sum and samples.
    fn accumulate(&self, totals: &mut [f64], outcome: &StepOutcome) {
        totals[0] += outcome.loss * outcome.samples as f64;
        totals[1] += outcome.samples as f64;
    }

    fn train_metrics(&self, totals: &[f64]) -> (f64, Option<f64>) {
        (totals[0] / totals[1].max(1.0), None)
    }

    fn evaluate(&mut self, stepper: &mut Stepper, ctx: &RankContext) -> Result<Evaluation> {
        let batches = (self.local_batch, self.micro_batches);
        let loss = validate(stepper, &self.val, batches, ctx, self.mesh)?;
        Ok(Evaluation {
            loss,
            accuracy: None,
        })
    }

    fn loss_floor(&self) -> Option<f64> {
        self.loss_floor
    }

    fn export(
        &mut self,
        stepper: &mut Stepper,
        run: &RunFolder,
        summary: &FitSummary,
    ) -> Result<()> {
        let parts = (self.mesh, self.split_layers);
        export(stepper, parts, self.config, run, (summary, self.start))
    }
}
