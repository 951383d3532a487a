//! `cargo xtask bench-pipeline`: pipeline parallelism on this machine's CPU. Trains the GPT
//! with `--pp P` over P processes (shm) under GPipe and 1F1B for each micro-batch count, and
//! prints, per stage, the measured bubble (the part of the schedule's wall time the stage
//! computed nothing) beside the formula `(P − 1) / (M + P − 1)`, the peak of micro-batches
//! and of activation bytes held, and the tokens per second (one process on all cores first,
//! for scale). Each run is `train-gpt` itself, started as a subprocess; its `metrics.jsonl`
//! step lines after the warm-up are averaged.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use clap::Args;

#[derive(Debug, Args)]
pub struct BenchPipelineArgs {
    #[arg(long, default_value = "gpt-tiny")]
    model: String,
    /// Pipeline stages (one process each)
    #[arg(long, default_value_t = 2)]
    pp: usize,
    /// Micro-batch counts, one pair of runs (GPipe, 1F1B) each
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    micro_batches: Vec<usize>,
    /// Sequences per step
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    #[arg(long, default_value_t = 128)]
    seq_len: usize,
    /// Steps per run; the first `warmup` are not counted
    #[arg(long, default_value_t = 10)]
    steps: usize,
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// How the stages are cut: params | time (train-gpt's --pp-balance)
    #[arg(long, default_value = "params")]
    balance: String,
}

/// One run's averages over its counted steps.
struct Averages {
    bubble: Vec<f64>,
    theory: f64,
    peak_micro_batches: Vec<u64>,
    peak_activation_mib: Vec<f64>,
    tokens_per_sec: f64,
}

pub fn run(args: &BenchPipelineArgs) -> Result<()> {
    if args.warmup >= args.steps {
        bail!(
            "--warmup {} must be fewer than --steps {}",
            args.warmup,
            args.steps
        );
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "bench-pipeline: {} over {} stages (one process each, {cores} cores), batch {} x {} tokens, {} steps ({} warm-up)",
        args.model, args.pp, args.batch_size, args.seq_len, args.steps, args.warmup
    );
    println!(
        "{:<8} {:>3} {:>8} {:>22} {:>12} {:>22} {:>10}",
        "schedule", "M", "formula", "bubble per stage", "peak mb", "peak act MiB", "tok/s"
    );
    let out = tempfile::tempdir()?;
    train(args, "1f1b", 1, 1, out.path(), "one-process")?;
    let one = averages(&out.path().join("one-process"), args.warmup)?;
    println!(
        "{:<8} {:>3} {:>8} {:>22} {:>12} {:>22} {:>10.0}",
        "1 proc", 1, "-", "-", "-", "-", one.tokens_per_sec
    );
    for &m in &args.micro_batches {
        for schedule in ["gpipe", "1f1b"] {
            let name = format!("{schedule}-m{m}");
            train(args, schedule, m, args.pp, out.path(), &name)?;
            let a = averages(&out.path().join(&name), args.warmup)?;
            let list = |v: &[f64], digits: usize| {
                v.iter()
                    .map(|x| format!("{x:.digits$}"))
                    .collect::<Vec<_>>()
                    .join(" / ")
            };
            let peaks: Vec<String> = a.peak_micro_batches.iter().map(u64::to_string).collect();
            println!(
                "{schedule:<8} {m:>3} {:>8.3} {:>22} {:>12} {:>22} {:>10.0}",
                a.theory,
                list(&a.bubble, 3),
                peaks.join(" / "),
                list(&a.peak_activation_mib, 1),
                a.tokens_per_sec
            );
        }
    }
    Ok(())
}

/// `train-gpt` over `pp` processes (stages) with `schedule` and `m` micro-batches into
/// `out/name`.
fn train(
    args: &BenchPipelineArgs,
    schedule: &str,
    m: usize,
    pp: usize,
    out: &Path,
    name: &str,
) -> Result<()> {
    let exe = std::env::current_exe()?;
    let pp = pp.to_string();
    let status = Command::new(exe)
        .args(["train-gpt", "--quiet", "--pp", &pp, "--nproc", &pp])
        .args(["--model", &args.model, "--schedule", schedule])
        .args(["--pp-balance", &args.balance])
        .args(["--micro-batches", &m.to_string()])
        .args(["--batch-size", &args.batch_size.to_string()])
        .args(["--seq-len", &args.seq_len.to_string()])
        .args(["--steps", &args.steps.to_string()])
        .args(["--val-tokens", "4096", "--name", name])
        .arg("--out")
        .arg(out)
        .stdout(Stdio::null())
        .status()
        .context("starting train-gpt")?;
    if !status.success() {
        bail!("train-gpt --schedule {schedule} --micro-batches {m} failed: {status}");
    }
    Ok(())
}

/// Means of the step lines after `warmup` in `run`'s metrics.
fn averages(run: &Path, warmup: usize) -> Result<Averages> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl"))?;
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(serde_json::from_str::<serde_json::Value>)
        .collect::<Result<_, _>>()?;
    let steps: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l.get("step").is_some())
        .skip(warmup)
        .collect();
    let Some(first) = steps.first() else {
        bail!("{}: no step after the warm-up", run.display());
    };
    let column = |key: &str| -> Result<Vec<Vec<f64>>> {
        steps
            .iter()
            .map(|l| {
                l[key]
                    .as_array()
                    .with_context(|| format!("{}: no `{key}` per stage", run.display()))
                    .map(|v| v.iter().filter_map(|x| x.as_f64()).collect())
            })
            .collect()
    };
    let mean_per_stage = |rows: Vec<Vec<f64>>| -> Vec<f64> {
        let stages = rows[0].len();
        (0..stages)
            .map(|s| rows.iter().map(|r| r[s]).sum::<f64>() / rows.len() as f64)
            .collect()
    };
    let max_per_stage = |rows: Vec<Vec<f64>>| -> Vec<f64> {
        let stages = rows[0].len();
        (0..stages)
            .map(|s| rows.iter().map(|r| r[s]).fold(0.0, f64::max))
            .collect()
    };
    let tokens: Vec<f64> = steps
        .iter()
        .filter_map(|l| l["tokens_per_sec"].as_f64())
        .collect();
    let tokens_per_sec = tokens.iter().sum::<f64>() / tokens.len().max(1) as f64;
    if first.get("bubble").is_none() {
        return Ok(Averages {
            bubble: Vec::new(),
            theory: 0.0,
            peak_micro_batches: Vec::new(),
            peak_activation_mib: Vec::new(),
            tokens_per_sec,
        });
    }
    Ok(Averages {
        bubble: mean_per_stage(column("bubble")?),
        theory: first["bubble_theory"].as_f64().unwrap_or(f64::NAN),
        peak_micro_batches: max_per_stage(column("peak_micro_batches")?)
            .into_iter()
            .map(|p| p as u64)
            .collect(),
        peak_activation_mib: max_per_stage(column("peak_activation_bytes")?)
            .into_iter()
            .map(|b| b / (1 << 20) as f64)
            .collect(),
        tokens_per_sec,
    })
}
