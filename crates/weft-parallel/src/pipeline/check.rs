//! Checks of a plan before it runs, and its ideal timing: every micro-batch's forward and
//! backward exactly once per stage (a forward before its backward), every send matched by one
//! receive on the neighbouring stage, and execution to the end without deadlock — simulated
//! with sends posted asynchronously, a receive waiting until its send is posted, and each
//! forward and backward taking a given time. The simulation also gives each stage's idle share:
//! the bubble the plan leaves with equal stages.

use std::collections::HashMap;

use super::action::Action;
use super::schedule::{Plan, ScheduleKind};

/// Why a plan or a partition is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("pipeline stages: {0}")]
    Partition(String),
    #[error("stage {stage}: {message}")]
    Incomplete { stage: usize, message: String },
    #[error("the plan deadlocks: {0}")]
    Deadlock(String),
}

/// What a valid plan does with forward time `forward` and backward time `backward` per
/// micro-batch and stage.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulation {
    /// When the last stage finishes.
    pub makespan: f64,
    /// Per stage: the share of the makespan it spends idle.
    pub bubble: Vec<f64>,
}

/// The message a send or receive carries: (kind, micro-batch, sending stage).
type Message = (&'static str, usize, usize);

/// The message `action` on `stage` sends or receives, or `None` for compute.
fn message(stage: usize, action: Action) -> Option<(bool, Message)> {
    match action {
        Action::SendActivation(i) => Some((true, ("activation", i, stage))),
        Action::RecvActivation(i) => Some((false, ("activation", i, stage.checked_sub(1)?))),
        Action::SendGrad(i) => Some((true, ("gradient", i, stage))),
        Action::RecvGrad(i) => Some((false, ("gradient", i, stage + 1))),
        _ => None,
    }
}

/// Checks that `plan` computes each micro-batch's forward (and backward) once per stage, in
/// order, and that every receive has its send.
pub fn check_complete(plan: &Plan) -> Result<(), PlanError> {
    let backward = plan.kind != ScheduleKind::ForwardOnly;
    let mut sends: HashMap<Message, usize> = HashMap::new();
    let mut recvs: HashMap<Message, usize> = HashMap::new();
    for (stage, actions) in plan.actions.iter().enumerate() {
        let fail = |message: String| PlanError::Incomplete { stage, message };
        let mut forwarded = vec![false; plan.microbatches];
        let mut done = vec![false; plan.microbatches];
        for &action in actions {
            match action {
                Action::Forward(i) if i >= plan.microbatches || forwarded[i] => {
                    return Err(fail(format!(
                        "forward of micro-batch {i} out of range or twice"
                    )))
                }
                Action::Forward(i) => forwarded[i] = true,
                Action::Backward(i) if i >= plan.microbatches || !forwarded[i] || done[i] => {
                    return Err(fail(format!(
                        "backward of micro-batch {i} before its forward, twice or out of range"
                    )))
                }
                Action::Backward(i) => done[i] = true,
                other => {
                    let (is_send, key) = message(stage, other)
                        .ok_or_else(|| fail(format!("{} has no neighbour", other.kind())))?;
                    *(if is_send { &mut sends } else { &mut recvs })
                        .entry(key)
                        .or_default() += 1;
                }
            }
        }
        if let Some(i) = forwarded.iter().position(|f| !f) {
            return Err(fail(format!("no forward of micro-batch {i}")));
        }
        if let Some(i) = done.iter().position(|d| backward && !d) {
            return Err(fail(format!("no backward of micro-batch {i}")));
        }
    }
    if sends != recvs {
        let unmatched = sends
            .keys()
            .chain(recvs.keys())
            .find(|k| sends.get(k) != recvs.get(k))
            .expect("the maps differ");
        return Err(PlanError::Incomplete {
            stage: unmatched.2,
            message: format!(
                "the {} of micro-batch {} is sent {} times and received {} times",
                unmatched.0,
                unmatched.1,
                sends.get(unmatched).copied().unwrap_or(0),
                recvs.get(unmatched).copied().unwrap_or(0)
            ),
        });
    }
    Ok(())
}

/// Runs `plan` in simulated time, checking that it completes (see the module documentation).
pub fn simulate(plan: &Plan, forward: f64, backward: f64) -> Result<Simulation, PlanError> {
    check_complete(plan)?;
    let stages = plan.stages;
    let mut next = vec![0usize; stages];
    let mut clock = vec![0f64; stages];
    let mut busy = vec![0f64; stages];
    let mut posted: HashMap<Message, f64> = HashMap::new();
    loop {
        let mut progressed = false;
        for s in 0..stages {
            while let Some(&action) = plan.actions[s].get(next[s]) {
                match action {
                    Action::Forward(_) | Action::Backward(_) => {
                        let t = if matches!(action, Action::Forward(_)) {
                            forward
                        } else {
                            backward
                        };
                        clock[s] += t;
                        busy[s] += t;
                    }
                    other => {
                        let (is_send, key) = message(s, other).expect("checked complete");
                        if is_send {
                            posted.insert(key, clock[s]);
                        } else {
                            match posted.get(&key) {
                                Some(&at) => clock[s] = clock[s].max(at),
                                None => break,
                            }
                        }
                    }
                }
                next[s] += 1;
                progressed = true;
            }
        }
        if (0..stages).all(|s| next[s] == plan.actions[s].len()) {
            break;
        }
        if !progressed {
            let waiting: Vec<String> = (0..stages)
                .filter(|&s| next[s] < plan.actions[s].len())
                .map(|s| format!("stage {s} at {}", plan.actions[s][next[s]].kind()))
                .collect();
            return Err(PlanError::Deadlock(waiting.join(", ")));
        }
    }
    let makespan = clock.iter().cloned().fold(0.0, f64::max);
    let bubble = busy.iter().map(|b| 1.0 - b / makespan).collect();
    Ok(Simulation { makespan, bubble })
}
