//! One step of a stage's actions: what it keeps between them (the micro-batches between their
//! forward and backward, the activations and gradients to and from its neighbours) and what the
//! schedule measured. The loop over the plan reads like the plan; the two compute actions are
//! methods of [`PipelineTrainer`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use candle_core::{Shape, Tensor};
use weft_tensor::tape::{Seed, Tape};

use super::execute::PipelineTrainer;
use super::schedule::Plan;
use super::Action;
use crate::error::{ParallelError, Result};
use crate::step::{BackwardSeed, BatchResult, StepTimings};

/// A micro-batch between its forward and its backward.
struct InFlight {
    tape: Tape,
    /// What the tape keeps for backward.
    bytes: usize,
    /// Where backward starts (last stage only).
    loss: Option<BackwardSeed>,
    output_shape: Shape,
}

/// What a stage's part of a schedule measured.
#[derive(Debug, Default)]
pub(super) struct Measured {
    /// Time in the stage's forwards and backwards.
    compute: Duration,
    /// The schedule's wall time, the same span on every stage: from a barrier of all stages
    /// before the first action to one after every stage's last (a stage idle while another
    /// finishes its backwards is in the bubble, as in the plan's simulation).
    wall: Duration,
    pub peak_in_flight: usize,
    pub peak_activation_bytes: usize,
}

impl Measured {
    /// The part of the wall time the stage computed nothing.
    pub fn bubble(&self) -> f64 {
        let wall = self.wall.as_secs_f64();
        match wall > 0.0 {
            true => (1.0 - self.compute.as_secs_f64() / wall).max(0.0),
            false => 0.0,
        }
    }
}

/// What one step keeps between its actions.
struct StepState<'a> {
    /// The micro-batches' inputs (first stage) and targets (last stage).
    inputs: &'a [Tensor],
    targets: &'a [Tensor],
    /// The step's samples, by the objective's count (the last stage's loss weights).
    samples: usize,
    received: HashMap<usize, Tensor>,
    in_flight: HashMap<usize, InFlight>,
    outputs: HashMap<usize, Tensor>,
    output_grads: HashMap<usize, Tensor>,
    input_grads: HashMap<usize, Tensor>,
    results: Vec<(usize, BatchResult)>,
    backwards_done: usize,
    measured: Measured,
}

/// The error of a plan out of order: `action` on `stage` came before micro-batch `i`'s `what`.
fn missing(stage: usize, action: Action, i: usize, what: &str) -> ParallelError {
    ParallelError::Config(format!(
        "stage {stage}: {action:?} before micro-batch {i}'s {what}"
    ))
}

/// Micro-batch `i`'s entry of `map`, or the error naming what is missing.
fn take<T>(
    map: &mut HashMap<usize, T>,
    i: usize,
    what: &str,
    stage: usize,
    action: Action,
) -> Result<T> {
    map.remove(&i)
        .ok_or_else(|| missing(stage, action, i, what))
}

impl PipelineTrainer {
    /// Runs this stage's actions of `plan`: the micro-batches' results (last stage) and what
    /// the schedule measured.
    pub(super) fn run_plan(
        &mut self,
        plan: &Plan,
        inputs: &[Tensor],
        targets: &[Tensor],
        timings: &mut StepTimings,
    ) -> Result<(Vec<BatchResult>, Measured)> {
        let store = self.trainer.model().store();
        let (dtype, device) = (store.dtype(), store.device().clone());
        let objective = self.trainer.objective();
        let mut st = StepState {
            inputs,
            targets,
            samples: targets.iter().map(|t| objective.samples(t)).sum(),
            received: HashMap::new(),
            in_flight: HashMap::new(),
            outputs: HashMap::new(),
            output_grads: HashMap::new(),
            input_grads: HashMap::new(),
            results: Vec::new(),
            backwards_done: 0,
            measured: Measured::default(),
        };
        self.links.begin_step();
        self.all_stages_here()?;
        let (stage, started) = (self.stage(), Instant::now());
        for &action in &plan.actions[stage] {
            match action {
                Action::RecvActivation(i) => {
                    let x = self.links.recv_activation(dtype, &device)?;
                    self.arrived()?;
                    st.received.insert(i, x);
                }
                Action::Forward(i) => self.forward(&mut st, i, timings)?,
                Action::SendActivation(i) => {
                    let output = take(&mut st.outputs, i, "output", stage, action)?;
                    self.links.send_activation(&output)?;
                }
                Action::RecvGrad(i) => {
                    let Some(sent) = st.in_flight.get(&i) else {
                        return Err(missing(stage, action, i, "forward"));
                    };
                    let grad = self.links.recv_grad(&sent.output_shape, dtype, &device)?;
                    self.arrived()?;
                    st.output_grads.insert(i, grad);
                }
                Action::Backward(i) => self.backward(&mut st, i, plan.microbatches, timings)?,
                Action::SendGrad(i) => {
                    let grad = take(&mut st.input_grads, i, "input gradient", stage, action)?;
                    self.links.send_grad(&grad)?;
                }
            }
        }
        self.links.finish()?;
        self.all_stages_here()?;
        st.measured.wall = started.elapsed();
        st.results.sort_by_key(|(i, _)| *i);
        let results = st.results.into_iter().map(|(_, r)| r).collect();
        Ok((results, st.measured))
    }

    /// Micro-batch `i`'s forward: the stage's blocks on its input (the batch's on the first
    /// stage, the received activation elsewhere), the tape kept; the loss on the last stage,
    /// the output to send on the others.
    fn forward(&mut self, st: &mut StepState, i: usize, timings: &mut StepTimings) -> Result<()> {
        let start = Instant::now();
        let (first, stage) = (self.is_first(), self.stage());
        let x = match first {
            true => st.inputs[i].clone(),
            false => take(&mut st.received, i, "activation", stage, Action::Forward(i))?,
        };
        self.trainer.strategy_before_forward()?;
        let tape = self.trainer.forward_tape(&x, i, !first)?;
        let output_shape = tape.output().shape().clone();
        let loss = match self.is_last() {
            true => {
                let targets = &st.targets[i];
                let share = self.trainer.objective().samples(targets) as f64;
                let weight = share / st.samples.max(1) as f64;
                let (result, scaled) = self.trainer.weighted_loss(&tape, targets, weight)?;
                st.results.push((i, result));
                Some(scaled)
            }
            false => {
                st.outputs.insert(i, tape.output().clone());
                None
            }
        };
        let bytes = tape.saved_activation_bytes();
        let entry = InFlight {
            tape,
            bytes,
            loss,
            output_shape,
        };
        st.in_flight.insert(i, entry);
        let held: usize = st.in_flight.values().map(|f| f.bytes).sum();
        let m = &mut st.measured;
        m.peak_in_flight = m.peak_in_flight.max(st.in_flight.len());
        m.peak_activation_bytes = m.peak_activation_bytes.max(held);
        let spent = self.compute_time(start)?;
        timings.forward += spent;
        m.compute += spent;
        Ok(())
    }

    /// Micro-batch `i`'s backward, from its loss (last stage) or the received gradient of its
    /// output; parameter gradients written (the step's first backward) or added, the gradient
    /// sync started by the last of the `microbatches`; the input's gradient kept to send.
    fn backward(
        &mut self,
        st: &mut StepState,
        i: usize,
        microbatches: usize,
        timings: &mut StepTimings,
    ) -> Result<()> {
        let start = Instant::now();
        let (stage, action) = (self.stage(), Action::Backward(i));
        let state = take(&mut st.in_flight, i, "forward", stage, action)?;
        let received = st.output_grads.remove(&i);
        let seed = match (&state.loss, &received) {
            (Some(loss), _) => loss.as_seed(),
            (None, Some(grad)) => Seed::OutputGrad(grad),
            (None, None) => return Err(missing(stage, action, i, "output gradient")),
        };
        let done = st.backwards_done;
        self.trainer.set_require_sync(done + 1 == microbatches);
        let grad = self.trainer.backward_tape(state.tape, seed, done > 0)?;
        st.backwards_done += 1;
        if let (false, Some(grad)) = (self.is_first(), grad) {
            st.input_grads.insert(i, grad);
        }
        let spent = self.compute_time(start)?;
        timings.backward += spent;
        st.measured.compute += spent;
        Ok(())
    }

    /// Returns once every stage has called it (a barrier on the pipeline axis).
    fn all_stages_here(&self) -> Result<()> {
        self.stages.barrier().wait()?;
        Ok(())
    }

    /// Waits until a received tensor is on the device. On NCCL a receive's `wait` only orders
    /// the compute stream after the transfer, so without this the wait for the neighbour would
    /// fall inside the next forward's or backward's span and be counted as compute, not bubble.
    fn arrived(&self) -> Result<()> {
        Ok(self.trainer.model().store().device().synchronize()?)
    }

    /// Time since `start` of a forward or backward, once the device has run it: the bubble is
    /// the device's idle time, not the host's (on a GPU this costs the host's running ahead by
    /// one action; on the CPU nothing).
    fn compute_time(&self, start: Instant) -> Result<Duration> {
        self.trainer.model().store().device().synchronize()?;
        Ok(start.elapsed())
    }
}
