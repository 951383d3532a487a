//! Pipeline schedules as plans: per stage, the ordered list of actions, generated before the
//! step runs and printable. A stage's compute order is written first, as in the papers; the
//! sends and receives around each compute action are added by [`Plan::from_compute`]:
//! a forward is preceded by receiving its activation (except on the first stage) and followed
//! by sending its output (except on the last); a backward is preceded by receiving its output's
//! gradient (except on the last stage) and followed by sending its input's gradient (except on
//! the first). Sends are posted without waiting for the receiver (`isend`), as the executor
//! posts them.

use std::fmt;

use super::action::{Action, StageAction};

/// Which schedule a plan follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleKind {
    /// All forwards, then all backwards (GPipe): every micro-batch's activations held at once.
    GPipe,
    /// One forward, one backward (PipeDream-Flush / Megatron's 1F1B): stage `s` runs
    /// `P − 1 − s` warm-up forwards, then alternates, then drains the backwards.
    OneFOneB,
    /// Forwards only (evaluation).
    ForwardOnly,
}

/// Per stage, the ordered actions of one step over `microbatches` micro-batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub kind: ScheduleKind,
    pub stages: usize,
    pub microbatches: usize,
    pub actions: Vec<Vec<Action>>,
}

/// GPipe's compute order on a stage: `F0 … F(M−1)`, then `B0 … B(M−1)`.
fn gpipe_compute(m: usize) -> Vec<Action> {
    (0..m)
        .map(Action::Forward)
        .chain((0..m).map(Action::Backward))
        .collect()
}

/// 1F1B's compute order on stage `s` of `p`: warm-up forwards, steady one-forward-one-backward,
/// cool-down backwards.
fn one_f_one_b_compute(s: usize, p: usize, m: usize) -> Vec<Action> {
    let warmup = (p - 1 - s).min(m);
    let mut order: Vec<Action> = (0..warmup).map(Action::Forward).collect();
    for k in 0..m - warmup {
        order.push(Action::Forward(warmup + k));
        order.push(Action::Backward(k));
    }
    order.extend((m - warmup..m).map(Action::Backward));
    order
}

impl Plan {
    /// The plan of `kind` for `stages` stages and `microbatches` micro-batches (both ≥ 1).
    pub fn new(kind: ScheduleKind, stages: usize, microbatches: usize) -> Self {
        let (p, m) = (stages.max(1), microbatches.max(1));
        let compute = (0..p)
            .map(|s| match kind {
                ScheduleKind::GPipe => gpipe_compute(m),
                ScheduleKind::OneFOneB => one_f_one_b_compute(s, p, m),
                ScheduleKind::ForwardOnly => (0..m).map(Action::Forward).collect(),
            })
            .collect();
        Self::from_compute(kind, m, compute)
    }

    /// A plan from each stage's compute order, with the sends and receives added around it.
    pub fn from_compute(
        kind: ScheduleKind,
        microbatches: usize,
        compute: Vec<Vec<Action>>,
    ) -> Self {
        let stages = compute.len();
        let actions = compute
            .into_iter()
            .enumerate()
            .map(|(s, order)| {
                let (first, last) = (s == 0, s + 1 == stages);
                let mut actions = Vec::new();
                for action in order {
                    match action {
                        Action::Forward(i) => {
                            if !first {
                                actions.push(Action::RecvActivation(i));
                            }
                            actions.push(action);
                            if !last {
                                actions.push(Action::SendActivation(i));
                            }
                        }
                        Action::Backward(i) => {
                            if !last {
                                actions.push(Action::RecvGrad(i));
                            }
                            actions.push(action);
                            if !first {
                                actions.push(Action::SendGrad(i));
                            }
                        }
                        other => actions.push(other),
                    }
                }
                actions
            })
            .collect();
        Self {
            kind,
            stages,
            microbatches,
            actions,
        }
    }

    /// Stage `stage`'s actions with their stage, printable (`0F1`).
    pub fn stage_actions(&self, stage: usize) -> impl Iterator<Item = StageAction> + '_ {
        self.actions[stage]
            .iter()
            .map(move |&action| StageAction { stage, action })
    }

    /// The most micro-batches whose forward has run and whose backward has not, on `stage`:
    /// how many micro-batches' activations it holds at once.
    pub fn peak_in_flight(&self, stage: usize) -> usize {
        let (mut held, mut peak) = (0usize, 0usize);
        for action in &self.actions[stage] {
            match action {
                Action::Forward(_) if self.kind != ScheduleKind::ForwardOnly => held += 1,
                Action::Backward(_) => held -= 1,
                _ => {}
            }
            peak = peak.max(held);
        }
        peak
    }
}

/// The bubble fraction of GPipe and 1F1B with equal stages: `(P − 1) / (M + P − 1)`.
pub fn theoretical_bubble(stages: usize, microbatches: usize) -> f64 {
    (stages as f64 - 1.0) / (microbatches + stages - 1) as f64
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for stage in 0..self.stages {
            let actions: Vec<String> = self.stage_actions(stage).map(|a| a.to_string()).collect();
            writeln!(f, "stage {stage}: {}", actions.join(" "))?;
        }
        Ok(())
    }
}
