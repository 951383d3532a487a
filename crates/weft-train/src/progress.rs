//! The progress bar of the main rank: step count, loss, throughput and hidden communication.

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar, or nothing on other ranks or with `--quiet` (epoch lines still print).
pub struct Progress {
    bar: ProgressBar,
    visible: bool,
    unit: &'static str,
}

impl Progress {
    pub fn new(steps: u64, hidden: bool) -> Self {
        if hidden {
            return Self {
                bar: ProgressBar::hidden(),
                visible: false,
                unit: "img/s",
            };
        }
        let bar = ProgressBar::new(steps);
        let style = ProgressStyle::with_template(
            "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
        )
        .expect("the template is valid");
        bar.set_style(style);
        Self {
            bar,
            visible: true,
            unit: "img/s",
        }
    }

    /// The throughput's unit (default `img/s`).
    pub fn with_unit(mut self, unit: &'static str) -> Self {
        self.unit = unit;
        self
    }

    pub fn step(&self, epoch: usize, loss: f64, throughput: f64, comm_hidden: Option<f64>) {
        let hidden = comm_hidden
            .map(|h| format!(" comm hidden {:.0}%", 100.0 * h))
            .unwrap_or_default();
        self.bar.set_message(format!(
            "epoch {epoch} loss {loss:.4} {throughput:.0} {}{hidden}",
            self.unit
        ));
        self.bar.inc(1);
    }

    /// Prints a line above the bar (on the main rank, also when the bar is hidden by `--quiet`).
    pub fn println(&self, line: &str) {
        if self.visible {
            self.bar.println(line);
        } else if std::env::var("RANK").map_or(true, |r| r == "0") {
            println!("{line}");
        }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
