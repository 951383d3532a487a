//! One step of a pipeline plan: compute a micro-batch's forward or backward on a stage, or send
//! or receive its activation or its gradient. Printed as `torch.distributed.pipelining` prints
//! its actions: stage, kind, micro-batch (`0F1`, `1RECV_F0`, `0SEND_B3`).

use std::fmt;

/// What a stage does, to which micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Run the stage's blocks forward on micro-batch `i` (keeping what its backward needs).
    Forward(usize),
    /// Run the stage's backward for micro-batch `i`, accumulating parameter gradients.
    Backward(usize),
    /// Send micro-batch `i`'s output activation to the next stage.
    SendActivation(usize),
    /// Receive micro-batch `i`'s input activation from the previous stage.
    RecvActivation(usize),
    /// Send the gradient of micro-batch `i`'s input to the previous stage.
    SendGrad(usize),
    /// Receive the gradient of micro-batch `i`'s output from the next stage.
    RecvGrad(usize),
}

impl Action {
    /// The micro-batch the action concerns.
    pub fn microbatch(self) -> usize {
        match self {
            Action::Forward(i)
            | Action::Backward(i)
            | Action::SendActivation(i)
            | Action::RecvActivation(i)
            | Action::SendGrad(i)
            | Action::RecvGrad(i) => i,
        }
    }

    /// `F`, `B`, `SEND_F`, `RECV_F`, `SEND_B` or `RECV_B`.
    pub fn kind(self) -> &'static str {
        match self {
            Action::Forward(_) => "F",
            Action::Backward(_) => "B",
            Action::SendActivation(_) => "SEND_F",
            Action::RecvActivation(_) => "RECV_F",
            Action::SendGrad(_) => "SEND_B",
            Action::RecvGrad(_) => "RECV_B",
        }
    }
}

/// An action of stage `stage`, printed like PyTorch's (`0F1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageAction {
    pub stage: usize,
    pub action: Action,
}

impl fmt::Display for StageAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, i) = (self.action.kind(), self.action.microbatch());
        write!(f, "{}{kind}{i}", self.stage)
    }
}
