//! [`SingleProcess`]: the strategy of a step on one rank, communicating nothing. It still
//! checks what a distributed strategy relies on, so a model that would fail under DDP fails
//! here first: a parameter without a gradient is an error naming it (unless
//! `find_unused_parameters`), and so is a gradient reported twice.

use weft_tensor::{BlockModel, FlatBuffer};

use crate::error::Result;
use crate::ready::ReadyCheck;
use crate::strategy::{ReadyGrads, Strategy};

/// Training on one rank.
pub struct SingleProcess {
    check: ReadyCheck,
}

impl SingleProcess {
    /// Fails on a parameter without a gradient unless `find_unused_parameters` (its gradient
    /// is then zero).
    pub fn new(model: &BlockModel, find_unused_parameters: bool) -> Self {
        Self {
            check: ReadyCheck::new(model.store(), find_unused_parameters),
        }
    }
}

impl Strategy for SingleProcess {
    fn name(&self) -> &'static str {
        "single"
    }

    fn block_ready(&mut self, ready: &ReadyGrads, _grads: &FlatBuffer) -> Result<()> {
        self.check.report(ready)?;
        Ok(())
    }

    fn finish_backward(&mut self, _grads: &FlatBuffer) -> Result<()> {
        self.check.finish()
    }

    fn set_require_sync(&mut self, _sync: bool) {
        // Called before every micro-batch's backward: each reports every gradient once.
        self.check.reset();
    }

    /// Nothing is communicated, so nothing waits on the host: the step can be captured.
    fn capturable(&self) -> bool {
        true
    }
}
