//! The GPT language-model trainer (`cargo xtask train-gpt`): token data, model, optimizer and
//! schedule from the flags; tensor parallelism over groups of `--tp` ranks and data
//! parallelism (DDP or ZeRO-1/2/3) over the replicas;
//! per-step `loss`/`lr`/`tokens_per_sec` and per-epoch `val_loss` lines in `metrics.jsonl`;
//! per-rank traces, and the final weights with Hugging Face's names (loadable by
//! `GPT2LMHeadModel.from_pretrained`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use candle_core::Device;
use serde::Serialize;
use weft_data::DistributedSampler;
use weft_parallel::pipeline::PipelineTrainer;
use weft_parallel::zero::ShardLayout;
use weft_parallel::{BufferBroadcast, Trainer};
use weft_tensor::{Checkpointing, Timeline};

use crate::distributed::RankContext;
use crate::divergence::DivergenceGuard;
use crate::gpt_args::GptArgs;
use crate::gpt_data::open_data;
use crate::gpt_parallel::{GptMesh, TensorParallelLayers};
use crate::gpt_parts::{build_model, checkpoint_layout, export, objective, validate};
use crate::gpt_pipeline::{stage_blocks, GptStepper, PipelineReport};
use crate::logging;
use crate::memory_report;
use crate::optim_setup::{build_optimizer, build_schedule, with_step_settings};
use crate::parallelize::{self, GptParallelism};
use crate::progress::Progress;
use crate::resume;
use crate::run_checkpoints::Stage;
use crate::run_dir::RunFolder;
use crate::traces;

/// One line of `metrics.jsonl` per optimizer step.
#[derive(Debug, Serialize)]
pub struct TokenStepMetrics {
    pub step: usize,
    pub epoch: usize,
    /// Mean next-token loss of the step's batch (nats), before the update.
    pub loss: f64,
    pub lr: f64,
    /// The global batch's tokens over the loop's period: from the end of the previous step to
    /// the end of this one (the batch's building and the host's other work included).
    pub tokens_per_sec: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_norm: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f64>,
    /// With a pipeline: each stage's measured bubble and peak of micro-batches in flight.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<PipelineReport>,
}

/// One line of `metrics.jsonl` per epoch.
#[derive(Debug, Serialize)]
pub struct TokenEpochMetrics {
    pub epoch: usize,
    pub train_loss: f64,
    pub val_loss: f64,
    pub seconds: f64,
}

/// What a finished run reached.
#[derive(Debug, Clone, Serialize)]
pub struct GptRunSummary {
    pub run_dir: PathBuf,
    pub world_size: usize,
    pub steps: usize,
    /// The first step's loss of this invocation (the resumed step's when resuming).
    pub first_loss: f64,
    pub final_train_loss: f64,
    pub final_val_loss: f64,
    /// The synthetic data's best achievable loss (its entropy rate), when it is synthetic.
    pub loss_floor: Option<f64>,
    pub seconds: f64,
}

/// Trains as the flags say (on every rank of the job) and returns the final metrics.
pub fn run(args: &GptArgs) -> Result<GptRunSummary> {
    let device = crate::device::parse_device_for_rank(&args.training.device)?.open()?;
    let ctx = RankContext::from_env(&device)?;
    run_in(args, &ctx, &device)
}

/// [`run`] as one rank of `ctx`'s job, the model on `device` (the flags validated first).
pub fn run_in(args: &GptArgs, ctx: &RankContext, device: &Device) -> Result<GptRunSummary> {
    args.validate()?;
    logging::init(args.log.log_level, ctx.rank);
    weft_tensor::ops::set_deterministic(args.training.deterministic);
    let started = Instant::now();
    let device = device.clone();
    let mesh = GptMesh::with_pipeline(ctx.comm.as_ref(), args.parallel.tp, args.parallel.pp)?;
    let config = args.model_config()?;
    let seq_len = args.seq_len()?;
    let data = open_data(args, &config, seq_len)?;
    let policy = args.precision.policy()?;
    let split_layers = mesh.tp.clone().map(TensorParallelLayers::new);
    let micro_rows = args.training.batch_size / mesh.dp_size / args.training.micro_batches;
    let stages = stage_blocks(args, &config, &device, &data.train, micro_rows, ctx)?;
    let blocks = stages[mesh.stage].clone();
    let (model, zero3_shard) = build_model(
        args,
        &config,
        &policy,
        &device,
        &mesh,
        &split_layers,
        blocks,
    )?;
    let local_batch = args.training.batch_size / mesh.dp_size;
    // Every epoch gives each replica the same number of batches (the sampler pads to
    // ceil(len / replicas) windows each; the last partial batch is dropped).
    let sampler = DistributedSampler::new(data.train.len(), mesh.dp_size, mesh.dp_rank)?;
    let steps_per_epoch = sampler.num_samples() / local_batch;
    if steps_per_epoch == 0 {
        bail!(
            "--batch-size {}: more sequences than the {} training windows of {seq_len} tokens",
            args.training.batch_size,
            data.train.len()
        );
    }
    let total_steps = args.training.total_steps(steps_per_epoch);
    let epochs = total_steps.div_ceil(steps_per_epoch);
    let flags = args.optimizer_settings(total_steps)?;
    let schedule = build_schedule(&flags, total_steps)?;
    let timeline = Arc::new(Timeline::new(ctx.rank));
    timeline.time_on_device(&device);
    let mut trainer = Trainer::new(
        model,
        objective(&mesh, &config),
        build_optimizer(&flags, &device, policy.updated_dtype())?,
        match args.training.checkpoint_activations {
            true => Checkpointing::All,
            false => Checkpointing::None,
        },
    )?
    .with_timeline(timeline.clone())
    .with_dropout_seed(args.training.seed);
    trainer = with_step_settings(trainer, args.optim.clip_grad_norm, &policy)?;
    // The plan is a temporary: the shard it carries lives in the strategy alone.
    let trainer = parallelize::gpt(
        trainer,
        mesh.data_parallel(),
        &GptParallelism {
            zero: args.parallel.zero,
            ddp: args.parallel.ddp(BufferBroadcast::EveryForward),
            timeline: Some(timeline.clone()),
            tensor: mesh
                .tp
                .clone()
                .zip(split_layers.as_ref().map(TensorParallelLayers::splits)),
            pipeline: mesh.pipeline_parallel().cloned(),
            zero3_shard,
        },
    )?
    .with_memory_tracking();
    let mut stepper = match mesh.pipeline_parallel() {
        Some(stages) => GptStepper::Stage(PipelineTrainer::new(
            trainer,
            stages.clone(),
            args.parallel.schedule.kind(),
            args.training.micro_batches,
        )?),
        None => GptStepper::Whole(trainer),
    };
    let zero_shards = (args.parallel.zero > 0 && mesh.dp_size > 1)
        .then(|| ShardLayout::new(stepper.trainer_mut().grads().layout().len(), mesh.dp_size));
    let layout = checkpoint_layout(&mesh, &split_layers, zero_shards);
    let stage = Stage {
        index: mesh.stage,
        count: mesh.stages,
    };
    let resumed = match &args.checkpoints.resume {
        Some(path) => {
            let trainer = stepper.trainer_mut();
            resume::resume_run(path, trainer, (&layout, stage), steps_per_epoch, ctx)?
        }
        None => {
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
            "weft: {} ({} parameters) on {} x {}, {} train / {} val sequences of {seq_len} tokens, global batch {}, {} steps over {} epochs -> {}",
            args.model.model,
            stepper.model().store().num_parameters(),
            ctx.world_size,
            args.training.device,
            data.train.len(),
            data.val.len(),
            args.training.batch_size,
            total_steps,
            epochs,
            run.path.display()
        );
        if args.parallel.pp > 1 {
            tracing::info!(
                "pipeline: {} stages of blocks {stages:?} (0 = embeddings, {} = head), {:?} over {} micro-batches; dp {} x tp {}",
                args.parallel.pp,
                config.num_blocks() - 1,
                args.parallel.schedule,
                args.training.micro_batches,
                mesh.dp_size,
                args.parallel.tp
            );
        }
    }
    let mut progress =
        Progress::new(total_steps as u64, args.log.quiet, ctx.is_main()).with_unit("tok/s");
    let tokens_per_step = (args.training.batch_size * seq_len) as f64;
    let (mut step, mut first_loss, mut last) = (start, f64::NAN, (f64::NAN, f64::NAN));
    let mut guard =
        DivergenceGuard::new(policy.needs_loss_scaling(), args.training.max_skipped_steps);
    for epoch in start / steps_per_epoch..epochs {
        let epoch_start = Instant::now();
        let mut sampler = sampler.clone().with_seed(args.training.seed);
        sampler.set_epoch(epoch as u64);
        let indices = sampler.indices();
        // This rank's loss sum and token count over the epoch; a run resumed inside it goes
        // on from the sums before.
        let mut totals = [0.0; 2];
        totals
            .iter_mut()
            .zip(std::mem::take(&mut carried))
            .for_each(|(t, c)| *t = c);
        let done = match epoch == start / steps_per_epoch {
            true => start % steps_per_epoch,
            false => 0,
        };
        let mut period = Instant::now();
        for chunk in indices.chunks_exact(local_batch).skip(done) {
            if step == total_steps {
                break;
            }
            // Device time on a GPU, as the step's blocks are (`Timeline::time_on_device`).
            let step_span = timeline.open(format!("step {step}"), "step", "steps");
            let batch = match stepper.reads_batches() {
                true => Some(data.train.batch(chunk, &device)?),
                false => None,
            };
            let lr = schedule.lr_at(step);
            let (outcome, pipeline) =
                stepper.step(batch.as_ref(), args.training.micro_batches, lr)?;
            let seconds = period.elapsed().as_secs_f64();
            period = Instant::now();
            let global = ctx.step_loss_sum(&outcome, None)?;
            let loss = global[0] / global[1];
            if step == start {
                first_loss = loss;
            }
            if let Some(run) = run.writer.as_mut() {
                run.log(&TokenStepMetrics {
                    step,
                    epoch,
                    loss,
                    lr,
                    tokens_per_sec: tokens_per_step / seconds,
                    grad_norm: args
                        .optim
                        .clip_grad_norm
                        .map(|_| outcome.metric("grad_norm")),
                    loss_scale: outcome.loss_scale,
                    pipeline,
                })?;
            }
            guard.check(step, loss, outcome.skipped, outcome.loss_scale)?;
            memory_log.push(step, stepper.trainer_mut().take_memory_samples())?;
            if step == 0 && !args.log.quiet {
                let flags = (&args.training, &args.optim, &args.parallel);
                let settings = memory_report::plan_settings(flags, policy, mesh.dp_size, true);
                let trainer = stepper.trainer_mut();
                for line in memory_report::model_state_table(trainer, &settings)?.lines() {
                    tracing::info!("{line}");
                }
                if let Some(peak) = trainer.memory_peak() {
                    tracing::info!("{}", memory_report::peak_line(peak));
                }
            }
            totals[0] += outcome.loss * outcome.samples as f64;
            totals[1] += outcome.samples as f64;
            step_span.close();
            step += 1;
            if args.checkpoints.saves_after(step) {
                let (trainer, keep) = (stepper.trainer_mut(), args.checkpoints.keep_last);
                let at = resume::SavePoint::after(step, steps_per_epoch, &totals, keep);
                resume::save(trainer, (&layout, stage), ctx, &run.path, at)?;
            }
            progress.step(epoch, loss, tokens_per_step / seconds, None);
            timeline.flush()?;
        }
        ctx.sum(&mut totals)?;
        let val_loss = validate(&mut stepper, &data.val, local_batch, args, ctx, &mesh)?;
        let metrics = TokenEpochMetrics {
            epoch,
            train_loss: totals[0] / totals[1].max(1.0),
            val_loss,
            seconds: epoch_start.elapsed().as_secs_f64(),
        };
        progress.println(&format!(
            "epoch {epoch}: train loss {:.4} | val loss {:.4}{} | {:.1} s",
            metrics.train_loss,
            metrics.val_loss,
            data.loss_floor
                .map(|f| format!(" (floor {f:.4})"))
                .unwrap_or_default(),
            metrics.seconds
        ));
        if let Some(run) = run.writer.as_mut() {
            run.log(&metrics)?;
        }
        timeline.flush()?;
        last = (metrics.train_loss, val_loss);
    }
    progress.finish();
    traces::finish(&timeline, &run.path, ctx)?;
    let summary = GptRunSummary {
        run_dir: run.path.clone(),
        world_size: ctx.world_size,
        steps: step,
        first_loss,
        final_train_loss: last.0,
        final_val_loss: last.1,
        loss_floor: data.loss_floor,
        seconds: started.elapsed().as_secs_f64(),
    };
    export(
        &mut stepper,
        (&mesh, &split_layers),
        &config,
        &run,
        (&summary, start),
    )?;
    ctx.barrier()?;
    Ok(summary)
}

/// `model-data-<unix seconds>`.
pub fn default_run_name(args: &GptArgs) -> String {
    let data = args.data.data.split(':').next().unwrap_or("data");
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("{}-{}-{}", args.model.model, data, stamp)
}
