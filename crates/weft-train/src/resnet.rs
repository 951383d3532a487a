//! The ResNet image-classification trainer (`cargo xtask train-resnet`): data, model, optimizer
//! and schedule from the flags; a progress bar; per-step and per-epoch metrics; validation after
//! each epoch; the final checkpoint in the run folder.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use weft_data::{DataLoader, Dataset, DistributedSampler, LoaderConfig, Pipeline};
use weft_models::{resnet, ResNetConfig};
use weft_tensor::Checkpointing;

use crate::args::TrainArgs;
use crate::data;
use crate::optim_setup::{build_optimizer, build_schedule};
use crate::run_dir::{EpochMetrics, RunDir, StepMetrics};
use crate::step::Trainer;

/// What a finished run reached.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub run_dir: std::path::PathBuf,
    pub steps: usize,
    pub epochs: usize,
    pub final_train_loss: f64,
    pub final_val_loss: f64,
    pub final_val_acc: f64,
    pub seconds: f64,
}

/// Trains as the flags say and returns the final metrics.
pub fn run(args: &TrainArgs) -> Result<RunSummary> {
    args.validate()?;
    let started = Instant::now();
    let device = crate::device::parse_device(&args.device)?.open()?;
    let data = data::open(args)?;
    let mut config = ResNetConfig::from_name(&args.model, data.num_classes)?.with_seed(args.seed);
    if args.cifar_stem {
        config = config.with_cifar_stem();
    }
    let model = resnet(&config, DType::F32, &device)?;
    if let Some(path) = &args.init_from {
        weft_tensor::state_dict::load_safetensors(model.store(), path)?;
    }
    let steps_per_epoch = data.train.len() / args.batch_size;
    if steps_per_epoch == 0 {
        anyhow::bail!(
            "--batch-size {}: larger than the training set ({} samples)",
            args.batch_size,
            data.train.len()
        );
    }
    let total_steps = args
        .steps
        .unwrap_or(usize::MAX)
        .min(args.epochs.max(1) * steps_per_epoch);
    let epochs = total_steps.div_ceil(steps_per_epoch);
    let schedule = build_schedule(args, total_steps)?;
    let checkpointing = if args.checkpoint_activations {
        Checkpointing::All
    } else {
        Checkpointing::None
    };
    let mut trainer = Trainer::new(model, build_optimizer(args)?, checkpointing)?;

    let name = args.name.clone().unwrap_or_else(|| default_run_name(args));
    let mut run = RunDir::create(&args.out, &name, args)?;
    println!(
        "weft: {} ({} parameters) on {}, {} train / {} val samples, batch {}, {} steps over {} epochs -> {}",
        args.model,
        trainer.model().store().num_parameters(),
        args.device,
        data.train.len(),
        data.val.len(),
        args.batch_size,
        total_steps,
        epochs,
        run.path().display()
    );
    let bar = progress_bar(total_steps as u64, args.quiet);
    let mut step = 0;
    let mut last = (0.0, 0.0, 0.0);
    for epoch in 0..epochs {
        let epoch_start = Instant::now();
        let mut sampler = DistributedSampler::new(data.train.len(), 1, 0)?
            .with_shuffle(args.shuffle)
            .with_seed(args.seed);
        sampler.set_epoch(epoch as u64);
        let loader = loader(
            &data.train,
            &data.train_pipeline,
            sampler.indices(),
            args,
            epoch,
            true,
        )?;
        let (mut loss_sum, mut correct, mut seen) = (0.0, 0, 0);
        for batch in loader {
            if step == total_steps {
                break;
            }
            let (images, labels) = batch?.to_tensors(&device)?;
            let lr = schedule.lr_at(step);
            let t = Instant::now();
            let outcome = trainer.step(&images, &labels, lr)?;
            let images_per_sec = args.batch_size as f64 / t.elapsed().as_secs_f64();
            run.log(&StepMetrics {
                step,
                epoch,
                loss: outcome.loss,
                lr,
                images_per_sec,
            })?;
            loss_sum += outcome.loss * args.batch_size as f64;
            correct += outcome.correct;
            seen += args.batch_size;
            step += 1;
            bar.set_message(format!(
                "epoch {epoch} loss {:.4} {:.0} img/s",
                outcome.loss, images_per_sec
            ));
            bar.inc(1);
        }
        let (val_loss, val_acc) = validate(&trainer, &data.val, &data.val_pipeline, args, &device)?;
        let metrics = EpochMetrics {
            epoch,
            train_loss: loss_sum / seen.max(1) as f64,
            train_acc: correct as f64 / seen.max(1) as f64,
            val_loss,
            val_acc,
            seconds: epoch_start.elapsed().as_secs_f64(),
        };
        bar.println(format!(
            "epoch {epoch}: train loss {:.4} acc {:.2}% | val loss {:.4} acc {:.2}% | {:.1} s",
            metrics.train_loss,
            100.0 * metrics.train_acc,
            metrics.val_loss,
            100.0 * metrics.val_acc,
            metrics.seconds
        ));
        run.log(&metrics)?;
        last = (metrics.train_loss, val_loss, val_acc);
    }
    bar.finish_and_clear();
    let summary = RunSummary {
        run_dir: run.path().to_path_buf(),
        steps: step,
        epochs,
        final_train_loss: last.0,
        final_val_loss: last.1,
        final_val_acc: last.2,
        seconds: started.elapsed().as_secs_f64(),
    };
    let weights = run.save_checkpoint(trainer.model().store(), &summary)?;
    println!(
        "done in {:.1} s: val acc {:.2}%, checkpoint {}",
        summary.seconds,
        100.0 * summary.final_val_acc,
        weights.display()
    );
    Ok(summary)
}

fn loader(
    dataset: &Arc<dyn Dataset>,
    pipeline: &Arc<Pipeline>,
    indices: Vec<usize>,
    args: &TrainArgs,
    epoch: usize,
    drop_last: bool,
) -> Result<DataLoader> {
    let config = LoaderConfig {
        batch_size: args.batch_size,
        drop_last,
        num_workers: args.workers,
        seed: args.seed,
        epoch: epoch as u64,
        ..LoaderConfig::default()
    };
    Ok(DataLoader::new(
        dataset.clone(),
        pipeline.clone(),
        indices,
        config,
    )?)
}

/// Mean loss and accuracy over the whole validation set, in evaluation mode.
fn validate(
    trainer: &Trainer,
    val: &Arc<dyn Dataset>,
    pipeline: &Arc<Pipeline>,
    args: &TrainArgs,
    device: &Device,
) -> Result<(f64, f64)> {
    let indices: Vec<usize> = (0..val.len()).collect();
    let (mut loss_sum, mut correct) = (0.0, 0);
    for batch in loader(val, pipeline, indices, args, 0, false)? {
        let (images, labels) = batch?.to_tensors(device)?;
        let (loss, hits) = trainer.evaluate(&images, &labels).context("validation")?;
        loss_sum += loss;
        correct += hits;
    }
    let n = val.len().max(1) as f64;
    Ok((loss_sum / n, correct as f64 / n))
}

fn progress_bar(steps: u64, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(steps);
    let style = ProgressStyle::with_template(
        "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
    )
    .expect("the template is valid");
    bar.set_style(style);
    bar
}

fn default_run_name(args: &TrainArgs) -> String {
    let data = args.data.split(':').next().unwrap_or("data");
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("{}-{}-{}", args.model, data, stamp)
}
