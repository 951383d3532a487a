//! What the language-model trainer's tests share: flags parsed as the command line parses
//! them, a run on one process or on thread ranks, and the run folder's metric lines.
// Each test binary uses its own subset of these.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use clap::Parser;
use weft_tensor::{tape, BlockModel, Checkpointing, Mode, Objective};
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

/// [`tiny`] with `--model llama-tiny`, writing under `out`.
pub fn llama_tiny(out: &Path, extra: &[&str]) -> GptArgs {
    let out = out.to_str().unwrap();
    let base = ["--model", "llama-tiny", "--out", out];
    tiny(&[&base[..], extra].concat())
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

/// The losses of the run `name` in `out` and the weights it exported as a Hugging Face folder.
pub fn losses_and_export(out: &Path, name: &str) -> (Vec<f64>, HashMap<String, Tensor>) {
    let weights = out.join(name).join("hf/model.safetensors");
    let weights = candle_core::safetensors::load(weights, &Device::Cpu).unwrap();
    (values(&out.join(name), "loss"), weights)
}

/// The largest absolute difference between `a` and `b`, in f64.
pub fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    let d = (a.to_dtype(DType::F64).unwrap() - b.to_dtype(DType::F64).unwrap()).unwrap();
    d.abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

/// The gradients of `objective`'s loss on `ids` and `targets` from the blocks' own backward
/// under `checkpointing` (the model's entries in order), and the activation bytes the tape kept.
pub fn tape_gradients(
    model: &BlockModel,
    (ids, targets): (&Tensor, &Tensor),
    objective: &dyn Objective,
    checkpointing: &Checkpointing,
) -> (usize, Vec<Tensor>) {
    let tape = tape::forward(model, ids, Mode::TRAIN, checkpointing).unwrap();
    let bytes = tape.saved_activation_bytes();
    let loss = objective.loss(tape.output(), targets).unwrap().loss;
    let mut ready = Vec::new();
    tape.backward(&loss, model, |block| {
        ready.extend(block.grads);
        Ok::<(), weft_tensor::TensorError>(())
    })
    .unwrap();
    ready.sort_by_key(|(id, _)| *id);
    let grads = ready
        .into_iter()
        .map(|(_, g)| g.expect("every parameter has a gradient"));
    (bytes, grads.collect())
}
