//! Stopping a run that diverged. Without loss scaling (fp32, bf16-true) a loss that is not
//! finite ends the run at once, naming the step: every later step would only spread the NaN.
//! Under loss scaling (fp16-mixed) such a step is the scaler's to skip (it halves the scale),
//! but more than `--max-skipped-steps` skipped in a row means the scale is collapsing, and
//! that ends the run too. Every rank checks the same global loss and the same skip (the
//! scaler's found-inf flag is reduced over the ranks), so all of them stop at the same step.

use anyhow::{bail, Result};

/// The check of each step's loss, and the count of steps skipped in a row.
#[derive(Debug, Clone)]
pub struct DivergenceGuard {
    loss_scaling: bool,
    max_skipped: usize,
    skipped_in_a_row: usize,
}

impl DivergenceGuard {
    pub fn new(loss_scaling: bool, max_skipped: usize) -> Self {
        Self {
            loss_scaling,
            max_skipped,
            skipped_in_a_row: 0,
        }
    }

    /// Checks step `step`'s global mean `loss`, and whether the loss scaler skipped its update
    /// (with the scale after it).
    pub fn check(
        &mut self,
        step: usize,
        loss: f64,
        skipped: bool,
        loss_scale: Option<f64>,
    ) -> Result<()> {
        if !self.loss_scaling {
            if !loss.is_finite() {
                bail!(
                    "step {step}: the loss is {loss}: the run diverged (lower --lr, warm up longer, or clip with --clip-grad-norm)"
                );
            }
            return Ok(());
        }
        self.skipped_in_a_row = match skipped {
            true => self.skipped_in_a_row + 1,
            false => 0,
        };
        if self.skipped_in_a_row > self.max_skipped {
            let scale = loss_scale.map_or(String::new(), |s| format!(", loss scale now {s}"));
            bail!(
                "step {step}: {} steps in a row skipped for inf/NaN gradients{scale}: more than --max-skipped-steps {}, the run diverged",
                self.skipped_in_a_row,
                self.max_skipped
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::DivergenceGuard;

    #[test]
    fn a_non_finite_loss_ends_an_unscaled_run_naming_the_step() {
        let mut guard = DivergenceGuard::new(false, 3);
        guard.check(0, 2.3, false, None).unwrap();
        for bad in [f64::NAN, f64::INFINITY] {
            let message = guard.check(7, bad, false, None).unwrap_err().to_string();
            assert!(message.starts_with("step 7: the loss is "), "{message}");
            assert!(!message.contains('\n'));
        }
    }

    /// Under loss scaling a NaN loss is the scaler's to skip; a clean step resets the count;
    /// the run ends on the fourth skip in a row with a limit of 3.
    #[test]
    fn skipped_steps_in_a_row_end_a_scaled_run_past_the_limit() {
        let mut guard = DivergenceGuard::new(true, 3);
        let sequence = [true, true, true, false, true, true, true];
        for (step, skipped) in sequence.into_iter().enumerate() {
            guard.check(step, f64::NAN, skipped, Some(1024.0)).unwrap();
        }
        let message = guard
            .check(7, f64::NAN, true, Some(0.5))
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            "step 7: 4 steps in a row skipped for inf/NaN gradients, loss scale now 0.5: more than --max-skipped-steps 3, the run diverged"
        );
    }
}
