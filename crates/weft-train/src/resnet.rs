//! The ResNet image-classification trainer (`train-resnet`): data, model, optimizer and schedule
//! from the flags, data parallelism (DDP, ZeRO-1/2/3, offload) over the ranks of the job, a fresh
//! or resumed run folder; then the one training loop ([`crate::fit`]) over the classification
//! task ([`crate::tasks::Classification`]).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use candle_core::Device;
use weft_data::DistributedSampler;
use weft_models::loss::Classification;
use weft_models::ResNetConfig;
use weft_parallel::BufferBroadcast;
use weft_tensor::Timeline;

use crate::args::TrainArgs;
use crate::data;
use crate::distributed::RankContext;
use crate::fit::{fit, FitPlan, FitSummary, Session, Stepper};
use crate::logging;
use crate::memory_report;
use crate::optim_setup::build_schedule;
use crate::parallelize::{self, ResNetParallelism};
use crate::resnet_parts::{build_model, checkpoint_layout};
use crate::resume;
use crate::run_checkpoints::Stage;
use crate::run_dir::{default_run_name, RunFolder};
use crate::step_engine::{self, StepSettings};
use crate::tasks;

/// What a finished run reached.
pub type RunSummary = FitSummary;

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
    if let Some(path) = &args.checkpoints.resume {
        // Before anything is read or touched: the command must train what the checkpoint's
        // run trained.
        crate::resume_config::check_command(path, args)?;
    }
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
    let data = data::open(&args.data, args.model.num_classes, args.training.seed)?;
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
    let settings = args.optimizer_settings(total_steps)?;
    let schedule = build_schedule(&settings, total_steps)?;
    let timeline = Arc::new(Timeline::new(ctx.rank));
    timeline.time_on_device(&device);
    let step = StepSettings {
        recompute: args.training.checkpoint_activations,
        clip_grad_norm: args.optim.clip_grad_norm,
        ..StepSettings::new(settings.clone(), policy)
    };
    let trainer = step_engine::assemble(model, Box::new(Classification), &step)?
        .with_timeline(timeline.clone());
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
            let open = || default_run_name(&args.model.model, &args.data.data);
            let run = RunFolder::open(&args.log.out, args.log.name.as_deref(), open, args, ctx)?;
            resume::Resumed::fresh(run)
        }
    };
    let session = Session::new(resumed, timeline, started);
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
            total_steps.div_ceil(steps_per_epoch),
            session.run.path.display()
        );
    }
    let flags = (&args.training, &args.optim, &args.parallel);
    let memory_plan = memory_report::plan_settings(flags, policy, ctx.world_size, false);
    let layout = layout.map(|layout| (layout, Stage::WHOLE));
    let steps = (total_steps, steps_per_epoch, local_batch);
    let plan = FitPlan::new(
        args,
        (sampler, schedule),
        steps,
        &policy,
        (layout, memory_plan),
    );
    let mut task = tasks::Classification {
        args,
        data,
        device: device.clone(),
        // The model's input: its compute dtype, channels-last when its blocks are.
        input: (policy.compute, config.channels_last),
        staging: Default::default(),
    };
    fit(&mut task, &mut Stepper::Whole(trainer), session, plan, ctx)
}
