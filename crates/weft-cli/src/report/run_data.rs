//! What `weft report` reads from a run folder: the step and epoch lines of
//! `metrics.jsonl`, the spans of the merged trace (or of each rank's), and rank 0's memory
//! samples. A malformed line is an error naming the file and line.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;
use weft_tensor::timeline::chrome::read_events;

use weft_train::fit::metrics::Line;
pub use weft_train::fit::metrics::{EpochLine, StepLine};

/// One span of a rank's timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSpan {
    pub rank: usize,
    pub track: String,
    pub name: String,
    pub category: String,
    pub start_us: f64,
    pub duration_us: f64,
}

impl TraceSpan {
    pub fn end_us(&self) -> f64 {
        self.start_us + self.duration_us
    }
}

/// One memory sample: bytes by category after a phase of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryLine {
    pub step: usize,
    pub phase: String,
    pub categories: Vec<(&'static str, f64)>,
    pub device_in_use: Option<f64>,
}

/// The categories of a memory sample, in stacking order.
pub const MEMORY_CATEGORIES: [&str; 6] = [
    "parameters",
    "gradients",
    "master_weights",
    "optimizer_states",
    "activations",
    "communication_buffers",
];

/// Everything the report draws.
#[derive(Debug, Clone, Default)]
pub struct RunData {
    pub folder: PathBuf,
    pub steps: Vec<StepLine>,
    pub epochs: Vec<EpochLine>,
    /// `img/s` or `tok/s`.
    pub throughput_unit: &'static str,
    pub spans: Vec<TraceSpan>,
    pub memory: Vec<MemoryLine>,
}

impl RunData {
    /// Reads run folder `folder`; `metrics.jsonl` is required, traces and memory are not.
    pub fn load(folder: &Path) -> Result<Self> {
        if !folder.is_dir() {
            bail!("{}: not a run folder", folder.display());
        }
        let mut data = RunData {
            folder: folder.to_path_buf(),
            throughput_unit: "img/s",
            ..Default::default()
        };
        let metrics = folder.join("metrics.jsonl");
        let text = std::fs::read_to_string(&metrics)
            .with_context(|| format!("{}: cannot read", metrics.display()))?;
        for (number, text) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let line = Line::parse(text)
                .with_context(|| format!("{} line {}", metrics.display(), number + 1))?;
            match line {
                Line::Step(step) => {
                    if step.tokens_per_sec.is_some() {
                        data.throughput_unit = "tok/s";
                    }
                    data.steps.push(step);
                }
                Line::Epoch(epoch) => data.epochs.push(epoch),
            }
        }
        data.spans = read_spans(folder)?;
        let memory = folder.join("memory-rank0.jsonl");
        if memory.exists() {
            for (line, value) in json_lines(&memory)? {
                let at = || format!("{} line {line}", memory.display());
                data.memory.push(MemoryLine {
                    step: usize_field(&value, "step").with_context(at)?,
                    phase: value["phase"].as_str().unwrap_or("").to_string(),
                    categories: MEMORY_CATEGORIES
                        .iter()
                        .map(|&c| Ok((c, f64_field(&value, c)?)))
                        .collect::<Result<_>>()
                        .with_context(at)?,
                    device_in_use: value.get("device_in_use").and_then(Value::as_f64),
                });
            }
        }
        Ok(data)
    }

    /// Ranks seen in the trace.
    pub fn ranks(&self) -> Vec<usize> {
        let mut ranks: Vec<usize> = self.spans.iter().map(|s| s.rank).collect();
        ranks.sort_unstable();
        ranks.dedup();
        ranks
    }

    /// Steps with a `step N` span on every rank of the trace, in order.
    pub fn traced_steps(&self) -> Vec<usize> {
        let ranks = self.ranks().len();
        let mut seen: HashMap<usize, usize> = HashMap::new();
        for s in self.spans.iter().filter(|s| s.category == "step") {
            if let Some(step) = step_number(&s.name) {
                *seen.entry(step).or_default() += 1;
            }
        }
        let mut steps: Vec<usize> = seen
            .into_iter()
            .filter(|&(_, n)| n == ranks)
            .map(|(s, _)| s)
            .collect();
        steps.sort_unstable();
        steps
    }

    /// The last step traced on every rank whose backward recorded its blocks (a step replayed
    /// as a CUDA graph records one span).
    pub fn last_step_with_blocks(&self) -> Option<usize> {
        self.traced_steps().into_iter().rev().find(|&step| {
            let (spans, _) = self.spans_of_step(step);
            spans.iter().any(|s| s.category == "backward")
        })
    }

    /// Every rank's spans inside step `step` (the step span itself left out), and the step's
    /// start (the earliest rank's).
    pub fn spans_of_step(&self, step: usize) -> (Vec<&TraceSpan>, f64) {
        let windows: HashMap<usize, (f64, f64)> = self
            .spans
            .iter()
            .filter(|s| s.category == "step" && step_number(&s.name) == Some(step))
            .map(|s| (s.rank, (s.start_us, s.end_us())))
            .collect();
        let start = windows.values().map(|w| w.0).fold(f64::INFINITY, f64::min);
        let inside = self
            .spans
            .iter()
            .filter(|s| s.category != "step")
            .filter(|s| {
                windows
                    .get(&s.rank)
                    .is_some_and(|&(a, b)| s.start_us >= a && s.start_us < b)
            })
            .collect();
        (inside, start)
    }
}

fn step_number(name: &str) -> Option<usize> {
    name.strip_prefix("step ")?.parse().ok()
}

fn json_lines(path: &Path) -> Result<Vec<(usize, Value)>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let value = serde_json::from_str(l)
                .with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))?;
            Ok((i + 1, value))
        })
        .collect()
}

fn f64_field(value: &Value, key: &str) -> Result<f64> {
    value
        .get(key)
        .and_then(Value::as_f64)
        .with_context(|| format!("field {key}: missing or not a number"))
}

fn usize_field(value: &Value, key: &str) -> Result<usize> {
    value
        .get(key)
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .with_context(|| format!("field {key}: missing or not a whole number"))
}

/// The spans of `trace.json`, or of every `trace-rank<R>.json` when there is no merged trace
/// (a run that did not finish).
fn read_spans(folder: &Path) -> Result<Vec<TraceSpan>> {
    let merged = folder.join("trace.json");
    let files: Vec<PathBuf> = match merged.exists() {
        true => vec![merged],
        false => {
            let mut files: Vec<PathBuf> = std::fs::read_dir(folder)?
                .filter_map(|e| Some(e.ok()?.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("trace-rank") && n.ends_with(".json"))
                })
                .collect();
            files.sort();
            files
        }
    };
    let mut spans = Vec::new();
    for file in files {
        let events = read_events(&file)?;
        let mut tracks: HashMap<(u64, u64), String> = HashMap::new();
        for e in events.iter().filter(|e| e["name"] == "thread_name") {
            let key = (
                e["pid"].as_u64().unwrap_or(0),
                e["tid"].as_u64().unwrap_or(0),
            );
            tracks.insert(key, e["args"]["name"].as_str().unwrap_or("").to_string());
        }
        for e in events.iter().filter(|e| e["ph"] == "X") {
            let (pid, tid) = (
                e["pid"].as_u64().unwrap_or(0),
                e["tid"].as_u64().unwrap_or(0),
            );
            spans.push(TraceSpan {
                rank: pid as usize,
                track: tracks.get(&(pid, tid)).cloned().unwrap_or_default(),
                name: e["name"].as_str().unwrap_or("").to_string(),
                category: e["cat"].as_str().unwrap_or("").to_string(),
                start_us: e["ts"].as_f64().unwrap_or(0.0),
                duration_us: e["dur"].as_f64().unwrap_or(0.0),
            });
        }
    }
    Ok(spans)
}
