//! The GPT language-model trainer (`train-gpt`): token data, model, optimizer and schedule from
//! the flags; the 3-D mesh (data parallelism with DDP or ZeRO-1/2/3 over the replicas, tensor
//! parallelism over groups of `--tp` ranks, `--pp` pipeline stages), a fresh or resumed run
//! folder; then the one training loop ([`crate::fit`]) over the next-token task
//! ([`crate::tasks::NextToken`]), whose export is loadable by `GPT2LMHeadModel.from_pretrained`.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use candle_core::Device;
use weft_data::DistributedSampler;
use weft_parallel::pipeline::PipelineTrainer;
use weft_parallel::zero::ShardLayout;
use weft_parallel::BufferBroadcast;
use weft_tensor::Timeline;

use crate::distributed::RankContext;
use crate::fit::{fit, FitPlan, FitSummary, Session, Stepper};
use crate::gpt_args::GptArgs;
use crate::gpt_data::open_data;
use crate::gpt_parallel::{GptMesh, TensorParallelLayers};
use crate::gpt_parts::{build_model, checkpoint_layout, objective};
use crate::gpt_pipeline::stage_blocks;
use crate::logging;
use crate::memory_report;
use crate::optim_setup::build_schedule;
use crate::parallelize::{self, GptParallelism};
use crate::resume;
use crate::run_checkpoints::Stage;
use crate::run_dir::{default_run_name, RunFolder};
use crate::step_engine::{self, StepSettings};
use crate::tasks;

/// What a finished run reached.
pub type GptRunSummary = FitSummary;

/// Trains as the flags say (on every rank of the job) and returns the final metrics.
pub fn run(args: &GptArgs) -> Result<GptRunSummary> {
    let device = crate::device::parse_device_for_rank(&args.training.device)?.open()?;
    let ctx = RankContext::from_env(&device)?;
    run_in(args, &ctx, &device)
}

/// [`run`] as one rank of `ctx`'s job, the model on `device` (the flags validated first).
pub fn run_in(args: &GptArgs, ctx: &RankContext, device: &Device) -> Result<GptRunSummary> {
    args.validate()?;
    if let Some(path) = &args.checkpoints.resume {
        // Before anything is read or touched: the command must train what the checkpoint's
        // run trained.
        crate::resume_config::check_command(path, args)?;
    }
    logging::init(args.log.log_level, ctx.rank);
    weft_tensor::ops::set_deterministic(args.training.deterministic);
    let started = Instant::now();
    let device = device.clone();
    let mesh = GptMesh::with_pipeline(ctx.comm.as_ref(), args.parallel.tp, args.parallel.pp)?;
    let config = args.model_config()?;
    let seq_len = args.seq_len()?;
    let data = open_data(args, &config, seq_len)?;
    let policy = args.precision.policy()?;
    let split_layers = mesh
        .tp
        .clone()
        .map(|g| Arc::new(TensorParallelLayers::new(g)));
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
    let sampler = DistributedSampler::new(data.train.len(), mesh.dp_size, mesh.dp_rank)?
        .with_seed(args.training.seed);
    let steps_per_epoch = sampler.num_samples() / local_batch;
    if steps_per_epoch == 0 {
        bail!(
            "--batch-size {}: more sequences than the {} training windows of {seq_len} tokens",
            args.training.batch_size,
            data.train.len()
        );
    }
    let total_steps = args.training.total_steps(steps_per_epoch);
    let flags = args.optimizer_settings(total_steps)?;
    let schedule = build_schedule(&flags, total_steps)?;
    let timeline = Arc::new(Timeline::new(ctx.rank));
    timeline.time_on_device(&device);
    let step = StepSettings {
        recompute: args.training.checkpoint_activations,
        clip_grad_norm: args.optim.clip_grad_norm,
        ..StepSettings::new(flags.clone(), policy)
    };
    let trainer = step_engine::assemble(model, objective(&mesh, &config), &step)?
        .with_timeline(timeline.clone())
        .with_dropout_seed(args.training.seed);
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
                .zip(split_layers.as_ref().map(|layers| layers.splits())),
            pipeline: mesh.pipeline_parallel().cloned(),
            tied_table: config.tied_table(),
            zero3_shard,
            cuda_graph: args.parallel.cuda_graph && args.training.micro_batches == 1,
        },
    )?
    .with_memory_tracking();
    let mut stepper = match mesh.pipeline_parallel() {
        Some(stages) => Stepper::Stage(PipelineTrainer::new(
            trainer,
            stages.clone(),
            args.parallel.schedule.kind(),
            args.training.micro_batches,
        )?),
        None => Stepper::Whole(trainer),
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
            let open = || default_run_name(&args.model.model_name(), &args.data.data);
            let run = RunFolder::open(&args.log.out, args.log.name.as_deref(), open, args, ctx)?;
            resume::Resumed::fresh(run)
        }
    };
    let start = resumed.start;
    let session = Session::new(resumed, timeline, started);
    if ctx.is_main() {
        tracing::info!(
            "weft: {} ({} parameters) on {} x {}, {} train / {} val sequences of {seq_len} tokens, global batch {}, {} steps over {} epochs -> {}",
            config.name(),
            stepper.model().store().num_parameters(),
            ctx.world_size,
            args.training.device,
            data.train.len(),
            data.val.len(),
            args.training.batch_size,
            total_steps,
            total_steps.div_ceil(steps_per_epoch),
            session.run.path.display()
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
    let flags = (&args.training, &args.optim, &args.parallel);
    let memory_plan = memory_report::plan_settings(flags, policy, mesh.dp_size, true);
    let steps = (total_steps, steps_per_epoch, local_batch);
    let layout = (Some((layout, stage)), memory_plan);
    let plan = FitPlan::new(args, (sampler, schedule), steps, &policy, layout);
    let batches = (local_batch, args.training.micro_batches);
    let parts = (&mesh, &split_layers, &config);
    let mut task = tasks::NextToken::new(data, seq_len, batches, &device, parts, start);
    fit(&mut task, &mut stepper, session, plan, ctx)
}
