//! DeepSpeed's delayed parameter update (ZeRO-Offload's "DPU") for an optimizer that steps a
//! host master copy: after the first exact steps, the update with step `k`'s gradients runs on
//! a thread of its own while step `k + 1`'s forward and backward run, and its result reaches
//! the parameters at the end of step `k + 1`. Each update therefore uses gradients one step
//! stale: this changes the math, which is why it is an option ([`Trainer::with_delayed_update`]).
//!
//! At the end of every delayed step, in order: the update in flight is joined, the master copy
//! is written into the parameters (under the strategy's before-update/after-step pair, so ZeRO
//! gathers or releases as after any update), the step's gradients are copied to the host, and
//! the next update is launched with them.

use std::ops::Range;
use std::thread::JoinHandle;

use candle_core::Tensor;
use weft_optim::{ModelOptimizer, OptimError, Shard};

use super::Trainer;
use crate::error::{ParallelError, Result};

/// What a finished background update hands back: the optimizer, and how its step went.
type Finished = (ModelOptimizer, std::result::Result<(), OptimError>);

/// The delayed update's setting and the update in flight.
pub(crate) struct DelayedUpdate {
    /// The first step whose update is delayed (the ones before update exactly).
    pub(crate) from_step: u64,
    running: Option<Running>,
}

/// An update running on its own thread.
struct Running {
    job: JoinHandle<Finished>,
    /// The optimizer's state bytes when it left (for the memory tracker meanwhile).
    state_bytes: usize,
}

impl DelayedUpdate {
    pub(crate) fn new(from_step: u64) -> Self {
        Self {
            from_step,
            running: None,
        }
    }

    /// The optimizer's state bytes while it is away on an update.
    pub(crate) fn away_state_bytes(&self) -> Option<usize> {
        self.running.as_ref().map(|r| r.state_bytes)
    }
}

impl Trainer {
    /// Delays each update of the host optimizer by one step from step `from_step` on (DeepSpeed's
    /// delayed parameter update for ZeRO-Offload): the update with a step's gradients runs on a
    /// CPU thread while the next step's forward and backward run on the device, and reaches the
    /// parameters at that next step's end. **It changes the math**: each update uses gradients
    /// computed at parameters one update older. The steps before `from_step` update exactly
    /// (the paper warms up with a few dozen). For an optimizer that steps a host master copy:
    /// offloaded from a GPU (`--offload-optimizer`), or on the CPU.
    pub fn with_delayed_update(mut self, from_step: u64) -> Result<Self> {
        if self.master_dtype.is_none() {
            return Err(ParallelError::Config(
                "the delayed update overlaps a host optimizer's step: it needs the optimizer \
                 offloaded (--offload-optimizer), not on the device"
                    .into(),
            ));
        }
        self.delayed = Some(DelayedUpdate::new(from_step));
        Ok(self)
    }

    /// Whether this step's update (the `steps_taken`-th) is delayed.
    pub(crate) fn delays_this_update(&self) -> bool {
        self.delayed
            .as_ref()
            .is_some_and(|d| self.steps_taken > d.from_step)
    }

    /// Waits for an update in flight, taking the optimizer back (its learning rate then set to
    /// the latest one asked for). The parameters are not written: the update reaches them at
    /// the next step's end, as without waiting.
    pub(crate) fn settle(&mut self) -> Result<()> {
        let Some(running) = self.delayed.as_mut().and_then(|d| d.running.take()) else {
            return Ok(());
        };
        let (mut optimizer, stepped) = running.job.join().map_err(|_| {
            ParallelError::Config(
                "the delayed optimizer update panicked; the optimizer is lost".into(),
            )
        })?;
        if let Some(lr) = self.lr {
            optimizer.set_lr(lr)?;
        }
        self.optimizer = Some(optimizer);
        Ok(stepped?)
    }

    /// The optimizer, after any update in flight has finished.
    pub(crate) fn settled_optimizer(&mut self) -> Result<&mut ModelOptimizer> {
        self.settle()?;
        self.optimizer.as_mut().ok_or_else(lost_optimizer)
    }

    /// The delayed update at the end of a step: the update in flight joined and written into
    /// the parameters, then this step's gradients (over `range`) copied to the host and their
    /// update launched on a thread of its own.
    pub(crate) fn delayed_update(&mut self, range: Range<usize>) -> Result<()> {
        self.write_settled_master(range.start)?;
        let shard = Shard {
            offset: range.start,
            buffer_len: self.grads.layout().len(),
        };
        let master = self.master_copy()?.clone();
        let Some(mut optimizer) = self.optimizer.take() else {
            return Err(lost_optimizer());
        };
        optimizer.download_gradients(&self.grads, &range)?;
        let state_bytes = optimizer.state_bytes();
        let timeline = self.options.timeline.clone();
        let job = std::thread::Builder::new()
            .name("weft-delayed-update".into())
            .spawn(move || {
                let span = timeline
                    .as_ref()
                    .map(|t| t.open_on_host("delayed update", "optimizer", "host"));
                let stepped = optimizer.step_master(&master, shard);
                if let Some(span) = span {
                    span.close();
                }
                (optimizer, stepped)
            })
            .map_err(|e| ParallelError::Config(format!("starting the delayed update: {e}")))?;
        if let Some(delayed) = self.delayed.as_mut() {
            delayed.running = Some(Running { job, state_bytes });
        }
        Ok(())
    }

    /// Completes a delayed update in flight and writes it into the parameters, so the model
    /// holds every gradient taken (call it before exporting the model at the end of training).
    /// Nothing to do without the delayed update. A collective under ZeRO: every rank calls it.
    pub fn flush_updates(&mut self) -> Result<()> {
        if self.delayed.is_none() {
            return Ok(());
        }
        let start = self
            .strategy
            .optimizer_range(self.grads.layout().len())
            .start;
        self.write_settled_master(start)
    }

    /// Joins the update in flight and writes the master copy (from flat element `start` on)
    /// into the parameters, under the strategy's before-update/after-step pair.
    fn write_settled_master(&mut self, start: usize) -> Result<()> {
        self.settle()?;
        self.strategy.before_update(&self.model)?;
        let optimizer = self.optimizer.as_mut().ok_or_else(lost_optimizer)?;
        let master = self.params.as_ref().ok_or_else(no_master)?;
        optimizer.write_master(&self.grads, self.model.store(), start, master)?;
        self.strategy.after_step(&self.model)
    }

    fn master_copy(&self) -> Result<&Tensor> {
        self.params.as_ref().ok_or_else(no_master)
    }
}

/// The error of an optimizer lost with a failed delayed update.
pub(crate) fn lost_optimizer() -> ParallelError {
    ParallelError::Config("the optimizer was lost with a failed delayed update".into())
}

fn no_master() -> ParallelError {
    ParallelError::Config("the delayed update needs the host master copy".into())
}
