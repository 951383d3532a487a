//! The ResNet image-classification trainer (`cargo xtask train-resnet`): data, model, optimizer
//! and schedule from the flags; data parallelism over the ranks of the job (if any); a progress
//! bar; per-step and per-epoch metrics reduced over ranks; validation after each epoch; per-rank
//! Chrome-trace timelines and the final checkpoint in the run folder.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use candle_core::{Device, Tensor};
use serde::Serialize;
use weft_data::DistributedSampler;
use weft_models::loss::Classification;
use weft_models::ResNetConfig;
use weft_parallel::{BufferBroadcast, LaunchedStep, Trainer};
use weft_tensor::{Checkpointing, Timeline};

use crate::args::TrainArgs;
use crate::data;
use crate::distributed::RankContext;
use crate::divergence::DivergenceGuard;
use crate::logging;
use crate::memory_report;
use crate::optim_setup::{build_optimizer, build_schedule, with_step_settings};
use crate::parallelize::{self, ResNetParallelism};
use crate::progress::Progress;
use crate::resnet_parts::{
    accumulate, build_model, checkpoint_layout, comm_hidden, loader, upload_batch, validate,
    BatchStaging,
};
use crate::resume;
use crate::run_checkpoints::Stage;
use crate::run_dir::{EpochMetrics, RunFolder, StepMetrics};
use crate::step_report::{DeferredReports, StepReport};
use crate::traces;

/// What a finished run reached.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub run_dir: PathBuf,
    pub world_size: usize,
    pub steps: usize,
    pub epochs: usize,
    pub final_train_loss: f64,
    pub final_val_loss: f64,
    pub final_val_acc: f64,
    pub seconds: f64,
}

/// Trains as the flags say (on every rank of the job) and returns the final metrics.
pub fn run(args: &TrainArgs) -> Result<RunSummary> {
    args.validate()?;
    let device = crate::device::parse_device_for_rank(&args.training.device)?.open()?;
    let ctx = RankContext::from_env(&device)?;
    run_in(args, &ctx, &device)
}

/// [`run`] as one rank of `ctx`'s job, the model on `device` (the flags validated first).
pub fn run_in(args: &TrainArgs, ctx: &RankContext, device: &Device) -> Result<RunSummary> {
    args.validate()?;
    logging::init(args.log.log_level, ctx.rank);
    weft_tensor::ops::set_deterministic(args.training.deterministic);
    weft_tensor::ops::set_conv_stats(args.model.conv_stats.into());
    let started = Instant::now();
    let device = device.clone();
    if !args.training.batch_size.is_multiple_of(ctx.world_size) {
        bail!(
            "--batch-size {} is not divisible by the {} ranks",
            args.training.batch_size,
            ctx.world_size
        );
    }
    let data = data::open(args)?;
    let mut config =
        ResNetConfig::from_name(&args.model.model, data.num_classes)?.with_seed(args.training.seed);
    if args.model.cifar_stem {
        config = config.with_cifar_stem();
    }
    config = config.with_channels_last(args.model.channels_last.resolve(&device));
    // Validated by `args.validate`: a preset the trainer supports on this device.
    let policy = args.precision.policy()?;
    let (model, zero3_shard) = build_model(&config, policy.param, &device, args, ctx)?;
    let local_batch = args.training.batch_size / ctx.world_size;
    // Every epoch gives each rank the same number of batches, as PyTorch's DistributedSampler
    // (padded to ceil(len / ranks) samples each) and a loader dropping the last partial batch
    // do: the epoch's steps, on every rank.
    let sampler = DistributedSampler::new(data.train.len(), ctx.world_size, ctx.rank)?
        .with_shuffle(args.data.shuffle)
        .with_seed(args.training.seed);
    let steps_per_epoch = sampler.num_samples() / local_batch;
    if steps_per_epoch == 0 {
        bail!(
            "--batch-size {}: larger than the training set ({} samples)",
            args.training.batch_size,
            data.train.len()
        );
    }
    let total_steps = args.training.total_steps(steps_per_epoch);
    let epochs = total_steps.div_ceil(steps_per_epoch);
    let settings = args.optimizer_settings(total_steps)?;
    let schedule = build_schedule(&settings, total_steps)?;
    let checkpointing = if args.training.checkpoint_activations {
        Checkpointing::All
    } else {
        Checkpointing::None
    };
    let timeline = Arc::new(Timeline::new(ctx.rank));
    timeline.time_on_device(&device);
    let mut trainer = Trainer::new(
        model,
        Box::new(Classification),
        build_optimizer(&settings, &device, policy.updated_dtype())?,
        checkpointing,
    )?
    .with_timeline(timeline.clone());
    trainer = with_step_settings(trainer, args.optim.clip_grad_norm, &policy)?;
    if let Some(from) = args.parallel.delayed_update_from {
        trainer = trainer.with_delayed_update(from)?;
    }
    // The plan is a temporary: the shard it carries lives in the strategy alone.
    let mut trainer = parallelize::resnet(
        trainer,
        ctx.comm.as_ref(),
        &ResNetParallelism {
            sync_bn: args.parallel.sync_bn,
            zero: args.parallel.zero,
            // ResNet's training forward writes its buffers without reading them (its
            // BatchNorms normalise with the batch's statistics): rank 0's, broadcast before they
            // are read, are what every read sees.
            ddp: args.parallel.ddp(BufferBroadcast::BeforeReads),
            cuda_graph: args.parallel.cuda_graph && args.training.micro_batches == 1,
            timeline: Some(timeline.clone()),
            zero3_shard,
        },
    )?
    .with_memory_tracking();
    if let Some(path) = &args.model.init_from {
        // Every rank loads the file; under ZeRO-3 each keeps its shard of it.
        trainer.with_full_parameters(|model| {
            Ok(weft_tensor::state_dict::load_safetensors(
                model.store(),
                path,
            )?)
        })?;
        trainer.reload_master_weights()?;
    }
    let layout = checkpoint_layout(&mut trainer, args, ctx)?;
    let resumed = match (&args.checkpoints.resume, &layout) {
        (Some(path), Some(layout)) => {
            let whole = (layout, Stage::WHOLE);
            resume::resume_run(path, &mut trainer, whole, steps_per_epoch, ctx)?
        }
        _ => {
            let open = || default_run_name(args);
            let run = RunFolder::open(&args.log.out, args.log.name.as_deref(), open, args, ctx)?;
            resume::Resumed::fresh(run)
        }
    };
    let (mut run, start, mut carried) = (resumed.run, resumed.start, resumed.epoch_totals);
    traces::stream(&timeline, &run.path)?;
    let mut memory_log = memory_report::MemoryLog::create(&run.path, ctx.rank)?;
    if ctx.is_main() {
        tracing::info!(
            "weft: {} ({} parameters) on {} x {}, {} train / {} val samples, global batch {}, {} loader threads per rank ({} cores here), {} steps over {} epochs -> {}",
            args.model.model,
            trainer.model().store().num_parameters(),
            ctx.world_size,
            args.training.device,
            data.train.len(),
            data.val.len(),
            args.training.batch_size,
            crate::resnet_parts::loader_workers(args),
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            total_steps,
            epochs,
            run.path.display()
        );
    }
    let mut progress = Progress::new(total_steps as u64, args.log.quiet, ctx.is_main());
    let mut step = start;
    let guard = DivergenceGuard::new(policy.needs_loss_scaling(), args.training.max_skipped_steps);
    let mut reports = DeferredReports::new(guard);
    let mut last = (0.0, 0.0, 0.0);
    let mut staging = BatchStaging::default();
    // The model's input: its compute dtype, channels-last when its blocks are.
    let input = (policy.compute, config.channels_last);
    for epoch in start / steps_per_epoch..epochs {
        let epoch_start = Instant::now();
        let mut sampler = sampler.clone();
        sampler.set_epoch(epoch as u64);
        // A resumed epoch starts after its batches done (each sample's augmentation derives
        // from its index, not its place in the epoch).
        let done = match epoch == start / steps_per_epoch {
            true => start % steps_per_epoch * local_batch,
            false => 0,
        };
        let mut loader = loader(
            &data.train,
            &data.train_pipeline,
            sampler.indices().split_off(done),
            args,
            local_batch,
            epoch,
            true,
        )?;
        // This rank's loss sum, correct count and samples over the epoch; a run resumed inside
        // it goes on from the sums before.
        let mut totals = [0.0; 3];
        totals
            .iter_mut()
            .zip(std::mem::take(&mut carried))
            .for_each(|(t, c)| *t = c);
        let mut skipped = 0;
        // The next batch, on the device: each step fetches and stages its successor while the
        // device runs it (`Trainer::step_micro_batches_then`), once steps replay straight into
        // the captured step's input buffer; the first is fetched here.
        let mut fetch = |loader: &mut weft_data::DataLoader, into: Option<&Tensor>| {
            let wait = Instant::now();
            let next = loader
                .next()
                .map(|batch| upload_batch(&batch?, &mut staging, &device, input, into));
            timeline.record("data", "data", "host", wait, Instant::now());
            next
        };
        let mut next = fetch(&mut loader, None);
        let mut period = Instant::now();
        // A replayed step launched and not yet read: the next one is launched before it is
        // read, so the device goes from one to the next (`Trainer::launch`).
        let mut in_flight: Option<(LaunchedStep, Launch)> = None;
        while let Some(batch) = next.take() {
            if step == total_steps {
                break;
            }
            let (images, labels) = batch?;
            let this = Launch {
                step,
                lr: schedule.lr_at(step),
                spans_before: timeline.len(),
            };
            let micro = (args.training.micro_batches, this.lr);
            // While the device runs this step: the next batch, the last step's report, and the
            // spans before this step into the trace (writing them took ~150 µs of the host's
            // turn between steps).
            let (mut reported, mut flushed) = (Ok(()), Ok(0));
            // Device time on a GPU, as the step's blocks are (`Timeline::time_on_device`).
            let step_span = timeline.open(format!("step {step}"), "step", "steps");
            // Written into once this step is launched, behind it on the device.
            let buffer = trainer.input_buffers().map(|(inputs, _)| inputs);
            let launched = trainer.launch_then(&images, &labels, micro, &mut || {
                next = fetch(&mut loader, buffer.as_ref());
                reported = reports.make(run.writer.as_mut(), &mut progress);
                flushed = timeline.flush_first(this.spans_before);
            });
            step_span.close();
            step += 1;
            // The steps to read now, in order: the one before (launched ahead of this one), and
            // this one unless it can be read after the next launch — not if the model is read
            // after it (a checkpoint, the epoch's end), it ran to completion anyway, or
            // `--launch-ahead false`.
            let mut finished = Vec::with_capacity(2);
            let flushed = (|| -> Result<usize> {
                let launched = launched?;
                if let Some((earlier, launch)) = in_flight.take() {
                    finished.push((trainer.finish(earlier)?, launch, Instant::now()));
                }
                let read_now = !args.parallel.launch_ahead
                    || !launched.is_queued()
                    || next.is_none()
                    || step == total_steps
                    || args.checkpoints.saves_after(step);
                match read_now {
                    true => finished.push((trainer.finish(launched)?, this, Instant::now())),
                    false => in_flight = Some((launched, this)),
                }
                reported?;
                Ok(flushed?)
            })();
            let flushed = match flushed {
                Ok(flushed) => flushed,
                Err(failure) => {
                    // The last step's line still reaches metrics.jsonl (the step's own error
                    // is the one reported).
                    let _ = reports.make(run.writer.as_mut(), &mut progress);
                    return Err(failure);
                }
            };
            // Each step's time runs from the end of the one before to its own end (two read in
            // one turn each keep their own).
            for (outcome, launch, ended) in finished {
                let spans_before = launch.spans_before.saturating_sub(flushed);
                let seconds = ended.duration_since(period).as_secs_f64();
                period = ended;
                let global = ctx.step_loss_sum(&outcome, Some(&timeline))?;
                timeline.settle()?;
                // A replay records no communication spans: nothing to attribute.
                let hidden = (ctx.world_size > 1 && !outcome.graphed)
                    .then(|| comm_hidden(&timeline.spans_since(spans_before)))
                    .flatten();
                let line = StepMetrics {
                    step: launch.step,
                    epoch,
                    loss: global[0] / global[1],
                    lr: launch.lr,
                    images_per_sec: args.training.batch_size as f64 / seconds,
                    comm_hidden: hidden,
                    grad_norm: args
                        .optim
                        .clip_grad_norm
                        .map(|_| outcome.metric("grad_norm")),
                    loss_scale: outcome.loss_scale,
                };
                let report = StepReport {
                    line,
                    skipped: outcome.skipped,
                };
                reports.hold(report, run.writer.as_mut(), &mut progress)?;
                skipped += usize::from(outcome.skipped);
                accumulate(&mut totals, &outcome);
                memory_log.push(launch.step, trainer.take_memory_samples())?;
                if launch.step == 0 && !args.log.quiet {
                    let flags = (&args.training, &args.optim, &args.parallel);
                    let settings =
                        memory_report::plan_settings(flags, policy, ctx.world_size, false);
                    for line in memory_report::model_state_table(&trainer, &settings)?.lines() {
                        tracing::info!("{line}");
                    }
                    if let Some(peak) = trainer.memory_peak() {
                        tracing::info!("{}", memory_report::peak_line(peak));
                    }
                }
                let after = launch.step + 1;
                if let (true, Some(layout)) = (args.checkpoints.saves_after(after), &layout) {
                    reports.make(run.writer.as_mut(), &mut progress)?;
                    let keep = args.checkpoints.keep_last;
                    let at = resume::SavePoint::after(after, steps_per_epoch, &totals, keep);
                    resume::save(&mut trainer, (layout, Stage::WHOLE), ctx, &run.path, at)?;
                }
            }
        }
        reports.make(run.writer.as_mut(), &mut progress)?;
        ctx.sum(&mut totals)?;
        let skipped_samples = match args.data.skip_bad_samples {
            true => {
                let mut bad = [loader.skipped_samples() as f64];
                ctx.sum(&mut bad)?;
                Some(bad[0] as usize)
            }
            false => None,
        };
        let (val_loss, val_acc) = validate(
            &mut trainer,
            &data,
            (args, local_batch),
            (&device, input),
            &mut staging,
            ctx,
        )?;
        let metrics = EpochMetrics {
            epoch,
            train_loss: totals[0] / totals[2].max(1.0),
            train_acc: totals[1] / totals[2].max(1.0),
            val_loss,
            val_acc,
            seconds: epoch_start.elapsed().as_secs_f64(),
            skipped_steps: policy.needs_loss_scaling().then_some(skipped),
            skipped_samples,
        };
        progress.println(&format!(
            "epoch {epoch}: train loss {:.4} acc {:.2}% | val loss {:.4} acc {:.2}% | {:.1} s{}",
            metrics.train_loss,
            100.0 * metrics.train_acc,
            metrics.val_loss,
            100.0 * metrics.val_acc,
            metrics.seconds,
            skipped_samples
                .filter(|&n| n > 0)
                .map(|n| format!(" | {n} bad samples replaced"))
                .unwrap_or_default()
        ));
        if let Some(run) = run.writer.as_mut() {
            run.log(&metrics)?;
        }
        timeline.flush()?;
        last = (metrics.train_loss, val_loss, val_acc);
    }
    progress.finish();
    traces::finish(&timeline, &run.path, ctx)?;
    let summary = RunSummary {
        run_dir: run.path.clone(),
        world_size: ctx.world_size,
        steps: step,
        epochs,
        final_train_loss: last.0,
        final_val_loss: last.1,
        final_val_acc: last.2,
        seconds: started.elapsed().as_secs_f64(),
    };
    // The delayed update in flight reaches the parameters; under ZeRO-3 every rank takes part
    // in gathering the whole model; rank 0 writes it.
    trainer.flush_updates()?;
    let saved = trainer.with_full_parameters(|model| {
        Ok(run
            .writer
            .as_ref()
            .map(|run| run.save_checkpoint(model.store(), &summary)))
    })?;
    if let Some(weights) = saved.transpose()? {
        tracing::info!(
            "done in {:.1} s: val acc {:.2}%, checkpoint {}",
            summary.seconds,
            100.0 * summary.final_val_acc,
            weights.display()
        );
    }
    ctx.barrier()?;
    Ok(summary)
}

/// What the loop knew of a step when it launched it.
struct Launch {
    step: usize,
    lr: f64,
    /// The timeline's length before the step.
    spans_before: usize,
}

/// `model-data-<unix seconds>`.
pub fn default_run_name(args: &TrainArgs) -> String {
    let data = args.data.data.split(':').next().unwrap_or("data");
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("{}-{}-{}", args.model.model, data, stamp)
}
