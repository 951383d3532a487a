//! The trainers' log through `tracing`: every line reads `[rank R] TIME LEVEL message` (the
//! same rank prefix `weft-run` gives a child's other output, so it adds none; the time in UTC,
//! RFC 3339), `--log-level` sets the most verbose level shown unless `RUST_LOG` gives a filter
//! (`RUST_LOG=weft_train=debug,warn`), and while a progress bar is drawn on a terminal, lines
//! are printed above it instead of through it.

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use clap::{Args, ValueEnum};
use indicatif::ProgressBar;
use serde::Serialize;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// The most verbose level logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    /// Run setup, epoch lines, and a step line every 5 % of the run when no progress bar is
    /// drawn (output to a file or a pipe).
    #[default]
    Info,
    /// Also a line for every step.
    Debug,
    Trace,
}

impl LogLevel {
    fn level(self) -> Level {
        match self {
            LogLevel::Error => Level::ERROR,
            LogLevel::Warn => Level::WARN,
            LogLevel::Info => Level::INFO,
            LogLevel::Debug => Level::DEBUG,
            LogLevel::Trace => Level::TRACE,
        }
    }
}

/// Where a run is written and what it says: the "Logging" section every trainer takes.
#[derive(Args, Debug, Clone, Serialize)]
#[command(next_help_heading = "Logging")]
#[serde(rename_all = "kebab-case")]
pub struct LogFlags {
    /// The most verbose log level shown: error, warn, info (setup, epochs, a step line every
    /// 5 % of the run when output is not a terminal) or debug (every step)
    #[arg(long, value_enum, default_value_t = LogLevel::Info)]
    pub log_level: LogLevel,
    /// Root of the run folders; the run is written to OUT/NAME
    #[arg(long, default_value = "runs")]
    pub out: std::path::PathBuf,
    /// Name of the run folder (default: model-data-timestamp)
    #[arg(long)]
    pub name: Option<String>,
    /// No progress bar (logs one line per epoch only)
    #[arg(long, default_value_t = false)]
    pub quiet: bool,
}

/// The rank of this process (or of this thread, for thread ranks), for the line prefix.
static PROCESS_RANK: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static THREAD_RANK: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// The progress bar on screen, if any: log lines are printed above it.
static ACTIVE_BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Installs the log (once per process; later calls only set the calling thread's rank) at
/// `level`, or filtered by `RUST_LOG` when that is set, lines prefixed with `rank`.
pub fn init(level: LogLevel, rank: usize) {
    PROCESS_RANK.store(rank, Ordering::Relaxed);
    THREAD_RANK.with(|r| r.set(Some(rank)));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter(level, std::env::var("RUST_LOG").ok()))
        .event_format(RankFormat)
        .with_writer(AboveTheBar)
        .try_init();
}

/// `RUST_LOG`'s filter when it is set and valid, else `level`; an invalid one is said in one
/// line (naming the variable) and `level` is used.
fn filter(level: LogLevel, rust_log: Option<String>) -> EnvFilter {
    let fallback = || EnvFilter::new(level.level().as_str().to_lowercase());
    match rust_log.filter(|text| !text.trim().is_empty()) {
        None => fallback(),
        Some(text) => EnvFilter::try_new(&text).unwrap_or_else(|err| {
            eprintln!("RUST_LOG={text:?}: {err}; logging at --log-level {level:?} instead");
            fallback()
        }),
    }
}

/// Shows `bar` (or, with `None`, none) as the bar log lines are printed above.
pub(crate) fn set_active_bar(bar: Option<ProgressBar>) {
    *ACTIVE_BAR.lock().unwrap_or_else(|e| e.into_inner()) = bar;
}

fn current_rank() -> usize {
    THREAD_RANK
        .with(|r| r.get())
        .unwrap_or_else(|| PROCESS_RANK.load(Ordering::Relaxed))
}

/// `[rank R] TIME LEVEL message key=value …` (no level for INFO).
struct RankFormat;

impl<S, N> FormatEvent<S, N> for RankFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let level = *event.metadata().level();
        write!(writer, "[rank {}] ", current_rank())?;
        SystemTime.format_time(&mut writer)?;
        writer.write_char(' ')?;
        if level != Level::INFO {
            write!(writer, "{level} ")?;
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Standard output, or above the progress bar while one is drawn.
struct AboveTheBar;

/// One event's text, written out in one piece when dropped.
struct LineBuffer(Vec<u8>);

impl<'a> MakeWriter<'a> for AboveTheBar {
    type Writer = LineBuffer;

    fn make_writer(&'a self) -> Self::Writer {
        LineBuffer(Vec::new())
    }
}

impl Write for LineBuffer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LineBuffer {
    fn drop(&mut self) {
        // Through `print!`, so a test harness captures it as it captures other output.
        let write = || print!("{}", String::from_utf8_lossy(&self.0));
        match ACTIVE_BAR
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_carry_the_rank_and_the_time_and_the_level_filters_them() {
        let lines = logged(filter(LogLevel::Info, None));
        assert_eq!(
            lines,
            [
                "[rank 3] epoch 0: train loss 2.5",
                "[rank 3] WARN the loss scale fell"
            ]
        );
    }

    #[test]
    fn rust_log_replaces_the_level_and_a_bad_one_falls_back() {
        let debug = filter(LogLevel::Warn, Some("weft_train=debug".into()));
        assert_eq!(logged(debug).len(), 3);
        let bad = filter(LogLevel::Warn, Some("weft_train=loud".into()));
        assert_eq!(logged(bad), ["[rank 3] WARN the loss scale fell"]);
    }

    /// Three events (info, debug, warn) from this crate's target through `filter`: the lines,
    /// each checked to carry an RFC 3339 UTC time after the rank and then stripped of it.
    fn logged(filter: EnvFilter) -> Vec<String> {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .event_format(RankFormat)
            .with_writer(move || writer.clone())
            .finish();
        THREAD_RANK.with(|r| r.set(Some(3)));
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("epoch 0: train loss {:.1}", 2.5);
            tracing::debug!("step 1/10");
            tracing::warn!("the loss scale fell");
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|line| {
                let (rank, rest) = line.split_at("[rank 3] ".len());
                let (time, message) = rest.split_once(' ').unwrap();
                assert!(
                    time.len() >= 20 && time.as_bytes()[10] == b'T' && time.ends_with('Z'),
                    "{line}"
                );
                format!("{rank}{message}")
            })
            .collect()
    }
}
