//! A finished step's report — its line in `metrics.jsonl`, the progress bar, the divergence
//! check — made one step late, on the host while the device runs the
//! next step (the step's `meanwhile`), so that the device does not idle for it between steps.
//! The loop makes the report still held before anything that must follow it: a checkpoint, the
//! epoch's line, the run's end.

use anyhow::Result;

use crate::divergence::DivergenceGuard;
use crate::fit::metrics::{Line, StepLine};
use crate::progress::Progress;
use crate::run_dir::RunDir;

/// What the report of one finished step says.
pub(crate) struct StepReport {
    pub line: StepLine,
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
        let (step, epoch, loss, scale) = (line.step, line.epoch, line.loss, line.loss_scale);
        let (rate, hidden) = (line.throughput().unwrap_or(0.0), line.comm_hidden);
        if let Some(writer) = writer {
            writer.log_line(&Line::Step(line))?;
        }
        self.guard.check(step, loss, skipped, scale)?;
        progress.step(epoch, loss, rate, hidden);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(step: usize, loss: f64) -> StepReport {
        StepReport {
            line: StepLine {
                step,
                epoch: 0,
                loss,
                lr: 0.1,
                images_per_sec: Some(1.0),
                tokens_per_sec: None,
                comm_hidden: None,
                grad_norm: None,
                loss_scale: None,
                pipeline: None,
            },
            skipped: false,
        }
    }

    #[test]
    fn a_step_is_reported_when_the_next_one_is_held_or_at_a_make() {
        let mut progress = Progress::new(4, true, false);
        let mut reports = DeferredReports::new(DivergenceGuard::new(false, 0));
        reports.make(None, &mut progress).unwrap();
        reports.hold(report(0, 2.0), None, &mut progress).unwrap();
        // Holding step 2 makes step 1's report: its divergence surfaces then, naming step 1.
        reports
            .hold(report(1, f64::NAN), None, &mut progress)
            .unwrap();
        let err = reports
            .hold(report(2, 2.0), None, &mut progress)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("step 1:"), "{err}");
        reports
            .hold(report(3, f64::INFINITY), None, &mut progress)
            .unwrap();
        let err = reports.make(None, &mut progress).unwrap_err().to_string();
        assert!(err.starts_with("step 3:"), "{err}");
        reports.make(None, &mut progress).unwrap();
    }
}
