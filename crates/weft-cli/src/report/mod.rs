//! `weft report RUN`: a run folder drawn as charts (SVG and PNG) — loss, accuracy,
//! throughput, one step's timeline per rank as a Gantt chart, memory by category — and a
//! summary table (time per phase, communication hidden, memory peaks) printed and written
//! to `summary.txt` beside them.

mod charts;
mod gantt;
mod run_data;
mod summary;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use plotters::style::{register_font, FontStyle};

use charts::{save, AccuracyChart, LossChart, MemoryChart, ThroughputChart};
use gantt::StepGantt;
use run_data::RunData;

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// The run folder (e.g. runs/resnet20-synthetic-1764100000)
    pub run: PathBuf,
    /// The step whose timeline is drawn (default: the last step traced on every rank with its
    /// blocks' spans, i.e. not replayed as a CUDA graph)
    #[arg(long)]
    pub step: Option<usize>,
    /// Where the charts go (default: RUN/report)
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Draws the report; returns the files written.
pub fn run(args: &ReportArgs) -> Result<Vec<PathBuf>> {
    register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| anyhow::anyhow!("the embedded DejaVu Sans font did not load"))?;
    let data = RunData::load(&args.run)?;
    let traced = data.traced_steps();
    let step = match (args.step, traced.last()) {
        (Some(step), _) if traced.contains(&step) => Some(step),
        (Some(step), _) => bail!(
            "--step {step}: not in the run's traces (traced steps: {})",
            describe(&traced)
        ),
        (None, last) => data.last_step_with_blocks().or(last.copied()),
    };
    let out = args.out.clone().unwrap_or_else(|| args.run.join("report"));
    std::fs::create_dir_all(&out).with_context(|| format!("{}: cannot create", out.display()))?;
    let mut written = Vec::new();
    if !data.steps.is_empty() {
        written.extend(save(&out, "loss", &LossChart(&data))?);
        written.extend(save(&out, "throughput", &ThroughputChart(&data))?);
    }
    if data.epochs.iter().any(|e| e.val_acc.is_some()) {
        written.extend(save(&out, "accuracy", &AccuracyChart(&data))?);
    }
    if let Some(step) = step {
        written.extend(save(&out, "timeline", &StepGantt::new(&data, step))?);
    }
    if !data.memory.is_empty() {
        written.extend(save(&out, "memory", &MemoryChart(&data))?);
    }
    let table = summary::summary(&data);
    let path = out.join("summary.txt");
    std::fs::write(&path, &table).with_context(|| format!("{}: cannot write", path.display()))?;
    written.push(path);
    print!("{table}");
    println!("\nwrote {} files to {}", written.len(), out.display());
    Ok(written)
}

fn describe(steps: &[usize]) -> String {
    match (steps.first(), steps.last()) {
        (Some(a), Some(b)) => format!("{a}..={b}"),
        _ => "none".into(),
    }
}

/// Whether `path` is a PNG of `width` × `height` pixels (its IHDR header).
#[cfg(test)]
fn png_size(path: &std::path::Path) -> Option<(u32, u32)> {
    let bytes = std::fs::read(path).ok()?;
    let word = |at: usize| Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
    (bytes.starts_with(b"\x89PNG\r\n\x1a\n")).then_some(())?;
    Some((word(16)?, word(20)?))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// A ResNet-20 run of 6 steps on tiny synthetic images, built from values.
    fn tiny_run(out: &Path) -> PathBuf {
        let mut args = weft_train::TrainArgs::default();
        args.model.model = "resnet20".into();
        args.data.image_size = 8;
        (args.data.synthetic_train, args.data.synthetic_val) = (64, 24);
        args.data.workers = Some(0);
        args.training.batch_size = 16;
        args.training.steps = Some(6);
        args.log.quiet = true;
        (args.log.out, args.log.name) = (out.to_path_buf(), Some("tiny".into()));
        weft_train::resnet::run(&args).unwrap().run_dir
    }

    #[test]
    fn a_run_folder_becomes_charts_and_a_summary() {
        let dir = tempfile::tempdir().unwrap();
        let run_dir = tiny_run(dir.path());
        let args = ReportArgs {
            run: run_dir.clone(),
            step: Some(3),
            out: None,
        };
        let written = run(&args).unwrap();
        for name in ["loss", "throughput", "accuracy", "timeline", "memory"] {
            let svg = std::fs::read_to_string(run_dir.join("report").join(format!("{name}.svg")))
                .unwrap();
            assert!(
                svg.contains("<svg") && svg.contains("<text"),
                "{name}.svg has no text"
            );
            let png = run_dir.join("report").join(format!("{name}.png"));
            assert!(
                png_size(&png).is_some_and(|(w, h)| w >= 900 && h >= 180),
                "{name}.png"
            );
        }
        assert_eq!(written.len(), 11);
        let summary = std::fs::read_to_string(run_dir.join("report/summary.txt")).unwrap();
        for phase in ["forward", "backward", "optimizer", "step", "activations"] {
            assert!(summary.contains(phase), "summary lacks {phase}:\n{summary}");
        }
        let timeline = std::fs::read_to_string(run_dir.join("report/timeline.svg")).unwrap();
        assert!(timeline.contains("step 3 timeline") && timeline.contains("rank 0 compute"));
    }

    #[test]
    fn bad_input_is_one_line_naming_the_file_flag_or_line() {
        let dir = tempfile::tempdir().unwrap();
        let run_dir = tiny_run(dir.path());
        let args = |step| ReportArgs {
            run: run_dir.clone(),
            step,
            out: None,
        };
        let err = run(&args(Some(99))).unwrap_err().to_string();
        assert!(
            err.starts_with("--step 99: not in the run's traces (traced steps: 0..=5)"),
            "{err}"
        );
        let metrics = run_dir.join("metrics.jsonl");
        let mut text = std::fs::read_to_string(&metrics).unwrap();
        text.push_str("{\"step\": \"seven\"}\n");
        std::fs::write(&metrics, text).unwrap();
        let err = format!("{:#}", run(&args(None)).unwrap_err());
        assert!(
            err.contains("metrics.jsonl line 9") && err.contains("\"seven\""),
            "{err}"
        );
        let err = run(&ReportArgs {
            run: dir.path().join("nothing"),
            step: None,
            out: None,
        })
        .unwrap_err()
        .to_string();
        assert!(err.ends_with("nothing: not a run folder"), "{err}");
    }
}
