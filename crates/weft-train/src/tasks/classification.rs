//! Image classification as a task of the loop: this rank's shard of the training images in
//! loader batches (decoded and augmented by background workers, the pixels uploaded through
//! pinned memory and normalised on the device, straight into the captured step's input
//! buffer), the loss, correct predictions and samples summed per epoch, the validation loss and
//! accuracy, and the final model with torchvision's names.

use std::cell::RefCell;
use std::rc::Rc;

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_data::DataLoader;
use weft_parallel::StepOutcome;

use crate::args::TrainArgs;
use crate::data::DataSets;
use crate::distributed::RankContext;
use crate::fit::{Batches, Evaluation, FitSummary, Stepper, Task, Throughput};
use crate::resnet_parts::{loader, upload_batch, validate, BatchStaging};
use crate::run_dir::RunFolder;

/// A ResNet's task.
pub struct Classification<'a> {
    pub args: &'a TrainArgs,
    pub data: DataSets,
    pub device: Device,
    /// The model's input: its compute dtype, channels-last when its blocks are.
    pub input: (DType, bool),
    /// Pinned staging reused by every epoch's batches and by validation.
    pub staging: Rc<RefCell<BatchStaging>>,
}

/// An epoch's loader batches, uploaded as they are taken.
struct ImageBatches {
    loader: DataLoader,
    staging: Rc<RefCell<BatchStaging>>,
    device: Device,
    input: (DType, bool),
}

impl Batches for ImageBatches {
    fn next_batch(&mut self, into: Option<&Tensor>) -> Option<Result<Option<(Tensor, Tensor)>>> {
        let batch = self.loader.next()?;
        let mut staging = self.staging.borrow_mut();
        Some(
            batch
                .map_err(anyhow::Error::from)
                .and_then(|b| upload_batch(&b, &mut staging, &self.device, self.input, into))
                .map(Some),
        )
    }

    fn skipped_samples(&self) -> usize {
        self.loader.skipped_samples()
    }
}

impl Task for Classification<'_> {
    fn throughput(&self) -> Throughput {
        Throughput::Images
    }

    fn batches(
        &mut self,
        indices: Vec<usize>,
        (epoch, batch, _reads): (usize, usize, bool),
    ) -> Result<Box<dyn Batches>> {
        let (train, pipeline) = (&self.data.train, &self.data.train_pipeline);
        Ok(Box::new(ImageBatches {
            loader: loader(train, pipeline, indices, self.args, batch, epoch, true)?,
            staging: self.staging.clone(),
            device: self.device.clone(),
            input: self.input,
        }))
    }

    fn totals_len(&self) -> usize {
        3
    }

    /// This rank's loss sum, correct predictions and samples.
    fn accumulate(&self, totals: &mut [f64], outcome: &StepOutcome) {
        totals[0] += outcome.loss * outcome.samples as f64;
        totals[1] += outcome.metric("correct");
        totals[2] += outcome.samples as f64;
    }

    fn train_metrics(&self, totals: &[f64]) -> (f64, Option<f64>) {
        let samples = totals[2].max(1.0);
        (totals[0] / samples, Some(totals[1] / samples))
    }

    fn evaluate(&mut self, stepper: &mut Stepper, ctx: &RankContext) -> Result<Evaluation> {
        let batch = self.args.training.batch_size / ctx.world_size;
        let mut staging = self.staging.borrow_mut();
        let (loss, accuracy) = validate(
            stepper.trainer_mut(),
            &self.data,
            (self.args, batch),
            (&self.device, self.input),
            &mut staging,
            ctx,
        )?;
        Ok(Evaluation {
            loss,
            accuracy: Some(accuracy),
        })
    }

    fn export(
        &mut self,
        stepper: &mut Stepper,
        run: &RunFolder,
        summary: &FitSummary,
    ) -> Result<()> {
        // Under ZeRO-3 every rank takes part in gathering the whole model; rank 0 writes it.
        let saved = stepper.trainer_mut().with_full_parameters(|model| {
            Ok(run
                .writer
                .as_ref()
                .map(|run| run.save_checkpoint(model.store(), summary)))
        })?;
        if let Some(weights) = saved.transpose()? {
            tracing::info!(
                "done in {:.1} s: val acc {:.2}%, checkpoint {}",
                summary.seconds,
                100.0 * summary.final_val_acc.unwrap_or(f64::NAN),
                weights.display()
            );
        }
        Ok(())
    }
}
