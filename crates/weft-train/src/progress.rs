//! The main rank's progress: a bar (step count, loss, throughput, hidden communication) when
//! its output is a terminal; otherwise a step line in the log every 5 % of the run (every
//! step at `--log-level debug`), so a log file reads well. Epoch lines go to the log.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

use crate::logging;

/// Progress of the main rank; other ranks and `--quiet` show no bar (epoch lines still log).
pub struct Progress {
    bar: Option<ProgressBar>,
    /// Whether this rank logs (the main rank).
    main: bool,
    quiet: bool,
    steps: u64,
    done: u64,
    unit: &'static str,
}

impl Progress {
    pub fn new(steps: u64, quiet: bool, main: bool) -> Self {
        let bar = (main && !quiet && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new(steps);
            let style = ProgressStyle::with_template(
                "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
            )
            .expect("the template is valid");
            bar.set_style(style);
            logging::set_active_bar(Some(bar.clone()));
            bar
        });
        Self {
            bar,
            main,
            quiet,
            steps,
            done: 0,
            unit: "img/s",
        }
    }

    /// The throughput's unit (default `img/s`).
    pub fn with_unit(mut self, unit: &'static str) -> Self {
        self.unit = unit;
        self
    }

    pub fn step(&mut self, epoch: usize, loss: f64, throughput: f64, comm_hidden: Option<f64>) {
        self.done += 1;
        let hidden = comm_hidden
            .map(|h| format!(" comm hidden {:.0}%", 100.0 * h))
            .unwrap_or_default();
        let message = format!(
            "epoch {epoch} loss {loss:.4} {throughput:.0} {}{hidden}",
            self.unit
        );
        if let Some(bar) = &self.bar {
            bar.set_message(message);
            bar.inc(1);
            return;
        }
        if !self.main || self.quiet {
            return;
        }
        let every = (self.steps / 20).max(1);
        if self.done.is_multiple_of(every) || self.done == self.steps {
            tracing::info!("step {}/{}: {message}", self.done, self.steps);
        } else {
            tracing::debug!("step {}/{}: {message}", self.done, self.steps);
        }
    }

    /// Logs a line on the main rank (above the bar while one is drawn, also with `--quiet`).
    pub fn println(&self, line: &str) {
        if self.main {
            tracing::info!("{line}");
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
            logging::set_active_bar(None);
        }
    }
}
