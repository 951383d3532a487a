//! What the language-model trainer's tests share: flags parsed as the command line parses
//! them, a run on one process or on thread ranks, and the run folder's metric lines.
// Each test binary uses its own subset of these.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use candle_core::Device;
use clap::Parser;
use weft_testing::on_thread_ranks;
use weft_train::distributed::RankContext;
use weft_train::GptArgs;

#[derive(Parser)]
#[command(args_override_self = true)]
struct Cli {
    #[command(flatten)]
    args: GptArgs,
}

/// `train-gpt`'s flags from `argv` (the program's name first).
pub fn parse<'a>(argv: impl IntoIterator<Item = &'a str>) -> GptArgs {
    Cli::parse_from(argv).args
}

/// A tiny run's flags: 16-token sequences of a small synthetic set, batches of 4, five steps,
/// quiet; then `extra`.
pub fn tiny(extra: &[&str]) -> GptArgs {
    let base = [
        "train",
        "--seq-len",
        "16",
        "--synthetic-tokens",
        "4096",
        "--val-tokens",
        "256",
        "--batch-size",
        "4",
        "--steps",
        "5",
        "--quiet",
    ];
    parse(base.into_iter().chain(extra.iter().copied()))
}

/// `train-gpt` with `args` on one process, or as a job of `ranks` thread ranks.
pub fn run(args: &GptArgs, ranks: usize) {
    if ranks == 1 {
        weft_train::gpt::run(args).unwrap();
        return;
    }
    on_thread_ranks(ranks, |rank, comm| {
        let ctx = RankContext {
            rank,
            world_size: ranks,
            comm: Some(comm as Arc<_>),
        };
        weft_train::gpt::run_in(args, &ctx, &Device::Cpu).unwrap();
    });
}

/// Every line of a run's `metrics.jsonl`.
pub fn lines(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The values of `key` in the metric lines of `run`, in order.
pub fn values(run: &Path, key: &str) -> Vec<f64> {
    lines(run)
        .iter()
        .filter_map(|l| l.get(key)?.as_f64())
        .collect()
}
