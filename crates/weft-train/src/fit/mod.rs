//! The one training loop every task runs ([`fit`]): epochs of this rank's batches, each step
//! launched before the one before it is read where the step replays from a CUDA graph, the next
//! batch fetched and staged (written into the captured step's input buffer) while the device
//! runs the step, each step's line reported one step late on the host, checkpoints at their
//! steps, evaluation and the epoch's line after each epoch, the final model exported. A task
//! ([`Task`]) brings its batches, its epoch sums, its evaluation and its export; the step is a
//! [`Stepper`] (the whole model's trainer, or one pipeline stage's).

pub mod metrics;
mod stepper;
mod task;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use serde::Serialize;
use weft_data::DistributedSampler;
use weft_optim::LrSchedule;
use weft_precision::PrecisionPolicy;
use weft_tensor::{timeline, Timeline};

pub use stepper::{Launched, Stepper};
pub use task::{Batches, Evaluation, Task, Throughput};

use self::metrics::{EpochLine, StepLine};
use crate::distributed::RankContext;
use crate::divergence::DivergenceGuard;
use crate::flags::{RunArgs, TaskDefaults};
use crate::memory_plan::PlanSettings;
use crate::memory_report::{self, MemoryLog};
use crate::progress::Progress;
use crate::resume::{self, Layout, SavePoint};
use crate::run_checkpoints::{CheckpointFlags, Stage};
use crate::run_dir::RunFolder;
use crate::step_report::{DeferredReports, StepReport};
use crate::traces;

/// Where a run's loop starts: its folder (new, or a resumed run's), the step it goes on from,
/// this rank's sums over the resumed epoch's steps before it, its timeline and when it began.
pub struct Session {
    pub run: RunFolder,
    pub start: usize,
    pub carried: Vec<f64>,
    pub timeline: Arc<Timeline>,
    pub started: Instant,
}

impl Session {
    /// The session of a fresh or resumed run (`resumed`), with its timeline, begun at `started`.
    pub fn new(resumed: resume::Resumed, timeline: Arc<Timeline>, started: Instant) -> Self {
        Self {
            run: resumed.run,
            start: resumed.start,
            carried: resumed.epoch_totals,
            timeline,
            started,
        }
    }
}

/// How the loop runs.
pub struct FitPlan<'a> {
    /// This rank's samples of each epoch (its shard of the data-parallel replicas', padded as
    /// PyTorch's `DistributedSampler` pads them: the same count on every replica).
    pub sampler: DistributedSampler,
    pub schedule: Box<dyn LrSchedule>,
    pub total_steps: usize,
    pub steps_per_epoch: usize,
    /// Samples per step on this rank, and in the global batch.
    pub local_batch: usize,
    pub global_batch: usize,
    pub micro_batches: usize,
    /// Read each replayed step after launching the next (`--launch-ahead`).
    pub launch_ahead: bool,
    /// Log each step's gradient norm (`--clip-grad-norm`).
    pub log_grad_norm: bool,
    /// The divergence check: whether a loss scaler skips steps, and how many in a row end the
    /// run.
    pub loss_scaling: bool,
    pub max_skipped_steps: usize,
    pub quiet: bool,
    pub checkpoints: &'a CheckpointFlags,
    /// How the state is cut for checkpoints (with `--save-every`).
    pub layout: Option<(Layout<'a>, Stage)>,
    /// The memory plan's settings, printed beside the measured model states after step 0.
    pub memory_plan: PlanSettings,
}

impl<'a> FitPlan<'a> {
    /// The plan a trainer's flags give, for a run of `total_steps` in epochs of
    /// `steps_per_epoch` of `local_batch` samples a rank, in `policy`'s precision, its state cut
    /// as `layout` says for checkpoints, its memory planned as `memory_plan` says.
    pub fn new<T: TaskDefaults>(
        args: &'a RunArgs<T>,
        (sampler, schedule): (DistributedSampler, Box<dyn LrSchedule>),
        (total_steps, steps_per_epoch, local_batch): (usize, usize, usize),
        policy: &PrecisionPolicy,
        (layout, memory_plan): (Option<(Layout<'a>, Stage)>, PlanSettings),
    ) -> Self {
        Self {
            sampler,
            schedule,
            total_steps,
            steps_per_epoch,
            local_batch,
            global_batch: args.training.batch_size,
            micro_batches: args.training.micro_batches,
            launch_ahead: args.parallel.launch_ahead,
            log_grad_norm: args.optim.clip_grad_norm.is_some(),
            loss_scaling: policy.needs_loss_scaling(),
            max_skipped_steps: args.training.max_skipped_steps,
            quiet: args.log.quiet,
            checkpoints: &args.checkpoints,
            layout,
            memory_plan,
        }
    }
}

/// What a finished run reached.
#[derive(Debug, Clone, Serialize)]
pub struct FitSummary {
    pub run_dir: PathBuf,
    pub world_size: usize,
    pub steps: usize,
    pub epochs: usize,
    /// The first step's loss of this invocation (the resumed step's when resuming).
    pub first_loss: f64,
    pub final_train_loss: f64,
    pub final_val_loss: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_val_acc: Option<f64>,
    /// The synthetic data's best achievable loss, when the task knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_floor: Option<f64>,
    pub seconds: f64,
}

/// What the loop knew of a step when it launched it.
struct Launch {
    step: usize,
    lr: f64,
    /// The timeline's length before the step.
    spans_before: usize,
}

/// Trains `task` with `stepper` from `session` as `plan` says (every rank of `ctx`'s job runs
/// it), evaluates after each epoch and exports the final model.
pub fn fit(
    task: &mut dyn Task,
    stepper: &mut Stepper,
    mut session: Session,
    plan: FitPlan<'_>,
    ctx: &RankContext,
) -> Result<FitSummary> {
    let (start, timeline) = (session.start, session.timeline.clone());
    let (total, per_epoch) = (plan.total_steps, plan.steps_per_epoch);
    let epochs = total.div_ceil(per_epoch);
    let throughput = task.throughput();
    let items_per_step = (plan.global_batch * throughput.per_sample()) as f64;
    traces::stream(&timeline, &session.run.path)?;
    let mut memory_log = MemoryLog::create(&session.run.path, ctx.rank)?;
    let mut progress =
        Progress::new(total as u64, plan.quiet, ctx.is_main()).with_unit(throughput.unit());
    let guard = DivergenceGuard::new(plan.loss_scaling, plan.max_skipped_steps);
    let mut reports = DeferredReports::new(guard);
    let (mut step, mut first_loss) = (start, f64::NAN);
    let mut last = (f64::NAN, f64::NAN, None);
    let reads = stepper.reads_batches();
    for epoch in start / per_epoch..epochs {
        let epoch_start = Instant::now();
        // A resumed epoch starts after its batches done (each sample's augmentation derives
        // from its index, not its place in the epoch).
        let done = match epoch == start / per_epoch {
            true => start % per_epoch * plan.local_batch,
            false => 0,
        };
        let mut sampler = plan.sampler.clone();
        sampler.set_epoch(epoch as u64);
        let mut order = sampler.indices();
        order.truncate(per_epoch * plan.local_batch);
        let order = order.split_off(done.min(order.len()));
        // This rank's sums over the epoch; a run resumed inside it goes on from the sums before.
        let mut totals = vec![0.0; task.totals_len()];
        totals
            .iter_mut()
            .zip(std::mem::take(&mut session.carried))
            .for_each(|(t, c)| *t = c);
        let mut skipped = 0;
        let mut batches = task.batches(order, (epoch, plan.local_batch, reads))?;
        // The next batch, on the device: each step fetches and stages its successor while the
        // device runs it, straight into the captured step's input buffer once steps replay.
        let fetch = |batches: &mut dyn Batches, into: Option<&candle_core::Tensor>| {
            let wait = Instant::now();
            let next = batches.next_batch(into);
            timeline.record("data", "data", "host", wait, Instant::now());
            next
        };
        let mut next = fetch(batches.as_mut(), None);
        let mut period = Instant::now();
        // A replayed step launched and not yet read: the next one is launched before it is
        // read, so the device goes from one to the next.
        let mut in_flight: Option<(Launched, Launch)> = None;
        while let Some(batch) = next.take() {
            if step == total {
                break;
            }
            let batch = batch?;
            let this = Launch {
                step,
                lr: plan.schedule.lr_at(step),
                spans_before: timeline.len(),
            };
            // While the device runs this step: the next batch, the last step's report, and the
            // spans before this step into the trace.
            let (mut reported, mut flushed) = (Ok(()), Ok(0));
            // Device time on a GPU, as the step's blocks are (`Timeline::time_on_device`).
            let step_span = timeline.open(format!("step {step}"), "step", "steps");
            // Written into once this step is launched, behind it on the device.
            let buffer = stepper.input_buffers().map(|(inputs, _)| inputs);
            let micro = (plan.micro_batches, this.lr);
            let launched = stepper.launch_then(batch.as_ref(), micro, &mut || {
                next = fetch(batches.as_mut(), buffer.as_ref());
                reported = reports.make(session.run.writer.as_mut(), &mut progress);
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
                    finished.push((stepper.finish(earlier)?, launch, Instant::now()));
                }
                let read_now = !plan.launch_ahead
                    || !launched.is_queued()
                    || next.is_none()
                    || step == total
                    || plan.checkpoints.saves_after(step);
                match read_now {
                    true => finished.push((stepper.finish(launched)?, this, Instant::now())),
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
                    let _ = reports.make(session.run.writer.as_mut(), &mut progress);
                    return Err(failure);
                }
            };
            // Each step's time runs from the end of the one before to its own end (two read in
            // one turn each keep their own).
            for ((outcome, pipeline), launch, ended) in finished {
                let spans_before = launch.spans_before.saturating_sub(flushed);
                let seconds = ended.duration_since(period).as_secs_f64();
                period = ended;
                let global = ctx.step_loss_sum(&outcome, Some(&timeline))?;
                timeline.settle()?;
                // A replay records no communication spans: nothing to attribute.
                let hidden = (ctx.world_size > 1 && !outcome.graphed)
                    .then(|| comm_hidden(&timeline.spans_since(spans_before)))
                    .flatten();
                let rate = items_per_step / seconds;
                let loss = global[0] / global[1];
                if launch.step == start {
                    first_loss = loss;
                }
                let line = StepLine {
                    step: launch.step,
                    epoch,
                    loss,
                    lr: launch.lr,
                    images_per_sec: (throughput == Throughput::Images).then_some(rate),
                    tokens_per_sec: (throughput != Throughput::Images).then_some(rate),
                    comm_hidden: hidden,
                    grad_norm: plan.log_grad_norm.then(|| outcome.metric("grad_norm")),
                    loss_scale: outcome.loss_scale,
                    pipeline,
                };
                let report = StepReport {
                    line,
                    skipped: outcome.skipped,
                };
                reports.hold(report, session.run.writer.as_mut(), &mut progress)?;
                skipped += usize::from(outcome.skipped);
                task.accumulate(&mut totals, &outcome);
                memory_log.push(launch.step, stepper.trainer_mut().take_memory_samples())?;
                if launch.step == 0 && !plan.quiet {
                    let trainer = stepper.trainer_mut();
                    let table = memory_report::model_state_table(trainer, &plan.memory_plan)?;
                    table.lines().for_each(|line| tracing::info!("{line}"));
                    if let Some(peak) = trainer.memory_peak() {
                        tracing::info!("{}", memory_report::peak_line(peak));
                    }
                }
                let after = launch.step + 1;
                if let (true, Some(layout)) = (plan.checkpoints.saves_after(after), &plan.layout) {
                    reports.make(session.run.writer.as_mut(), &mut progress)?;
                    let at = SavePoint::after(after, per_epoch, &totals, plan.checkpoints);
                    let trainer = stepper.trainer_mut();
                    resume::save(trainer, (&layout.0, layout.1), ctx, &session.run.path, at)?;
                }
            }
        }
        reports.make(session.run.writer.as_mut(), &mut progress)?;
        let replaced = batches.skipped_samples();
        drop(batches);
        ctx.sum(&mut totals)?;
        let mut replaced = [replaced as f64];
        ctx.sum(&mut replaced)?;
        let (train_loss, train_acc) = task.train_metrics(&totals);
        let eval = task.evaluate(stepper, ctx)?;
        let line = EpochLine {
            epoch,
            train_loss,
            train_acc,
            val_loss: eval.loss,
            val_acc: eval.accuracy,
            seconds: epoch_start.elapsed().as_secs_f64(),
            skipped_steps: plan.loss_scaling.then_some(skipped),
            skipped_samples: (replaced[0] > 0.0).then_some(replaced[0] as usize),
        };
        progress.println(&epoch_text(&line, task.loss_floor()));
        if let Some(run) = session.run.writer.as_mut() {
            run.log_line(&metrics::Line::Epoch(line))?;
        }
        timeline.flush()?;
        last = (train_loss, eval.loss, eval.accuracy);
    }
    progress.finish();
    traces::finish(&timeline, &session.run.path, ctx)?;
    let summary = FitSummary {
        run_dir: session.run.path.clone(),
        world_size: ctx.world_size,
        steps: step,
        epochs,
        first_loss,
        final_train_loss: last.0,
        final_val_loss: last.1,
        final_val_acc: last.2,
        loss_floor: task.loss_floor(),
        seconds: session.started.elapsed().as_secs_f64(),
    };
    // The delayed update in flight reaches the parameters before they are written.
    stepper.trainer_mut().flush_updates()?;
    task.export(stepper, &session.run, &summary)?;
    ctx.barrier()?;
    Ok(summary)
}

/// The epoch's line on the terminal.
fn epoch_text(line: &EpochLine, floor: Option<f64>) -> String {
    let acc = |a: Option<f64>| {
        a.map(|a| format!(" acc {:.2}%", 100.0 * a))
            .unwrap_or_default()
    };
    format!(
        "epoch {}: train loss {:.4}{} | val loss {:.4}{}{} | {:.1} s{}",
        line.epoch,
        line.train_loss,
        acc(line.train_acc),
        line.val_loss,
        acc(line.val_acc),
        floor
            .map(|f| format!(" (floor {f:.4})"))
            .unwrap_or_default(),
        line.seconds,
        line.skipped_samples
            .map(|n| format!(" | {n} bad samples replaced"))
            .unwrap_or_default()
    )
}

/// Share of a step's all-reduce time spent while backward was still running; `None` when the
/// host saw no all-reduce end (operations ordered on the device, or a replayed graph).
fn comm_hidden(spans: &[timeline::Span]) -> Option<f64> {
    let (comm, compute): (Vec<_>, Vec<_>) = spans
        .iter()
        .filter(|s| s.category == "allreduce" || s.category == "backward")
        .cloned()
        .partition(|s| s.category == "allreduce");
    (!comm.is_empty()).then(|| timeline::hidden_fraction(&comm, &compute))
}
