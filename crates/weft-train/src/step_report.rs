//! A finished step's report — its line in `metrics.jsonl`, the progress bar, the divergence
//! check — made one step late, on the host while the device runs the
//! next step (the step's `meanwhile`), so that the device does not idle for it between steps.
//! The loop makes the report still held before anything that must follow it: a checkpoint, the
//! epoch's line, the run's end.

use anyhow::Result;

use crate::divergence::DivergenceGuard;
use crate::progress::Progress;
use crate::run_dir::{RunDir, StepMetrics};

/// What the report of one finished step says.
pub(crate) struct StepReport {
    pub line: StepMetrics,
    /// Whether the loss scaler skipped the step's update.
    pub skipped: bool,
}

/// Where reports go, and the one held until the next [`DeferredReports::make`].
pub(crate) struct DeferredReports {
    held: Option<StepReport>,
    guard: DivergenceGuard,
}

impl DeferredReports {
    pub fn new(guard: DivergenceGuard) -> Self {
        Self { held: None, guard }
    }

    /// Holds `report` until the next [`Self::make`] (a report still held is made first).
    pub fn hold(
        &mut self,
        report: StepReport,
        writer: Option<&mut RunDir>,
        progress: &mut Progress,
    ) -> Result<()> {
        self.make(writer, progress)?;
        self.held = Some(report);
        Ok(())
    }

    /// Makes the held report, if any: logs it, moves the progress bar, and fails if the run
    /// diverged at its step.
    pub fn make(&mut self, writer: Option<&mut RunDir>, progress: &mut Progress) -> Result<()> {
        let Some(StepReport { line, skipped }) = self.held.take() else {
            return Ok(());
        };
        if let Some(writer) = writer {
            writer.log(&line)?;
        }
        self.guard
            .check(line.step, line.loss, skipped, line.loss_scale)?;
        progress.step(line.epoch, line.loss, line.images_per_sec, line.comm_hidden);
        Ok(())
    }
}
