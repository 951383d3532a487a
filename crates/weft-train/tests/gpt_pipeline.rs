//! `train-gpt` with pipeline parallelism against one process: `--pp 2` under 1F1B and GPipe,
//! and the 2 × 2 × 2 mesh (`--dp 2 --tp 2 --pp 2`, eight thread ranks, with DDP and with ZeRO-1
//! over the dp axis), log the losses of the unsplit run and end with its weights (the
//! checkpoint gathered from the stages).
//!
//! The runs are f32 and differ in the order of sums only: the tied token table's embedding and
//! head gradients summed across stages after accumulation instead of inside each backward, the
//! tensor-parallel partial sums, the data-parallel average. That is about 1e-7 relative per
//! step; AdamW's normalised update passes it on, so over four steps losses, gradient norms and
//! weights agree within 1e-4 (relative for the norm), which a wrong gradient (a table copy
//! left out of the sum, a micro-batch weighted wrongly) exceeds by orders of magnitude.

use std::path::Path;

use candle_core::{DType, Device};
use weft_train::GptArgs;

mod support;

/// `train-gpt` with `args` as a job of `world` thread ranks.
fn run_on_thread_ranks(world: usize, args: &GptArgs) {
    support::run(args, world)
}

/// The step lines of a run's metrics.
fn step_lines(dir: &Path) -> Vec<serde_json::Value> {
    let lines = support::lines(dir);
    lines
        .into_iter()
        .filter(|l| l.get("step").is_some())
        .collect()
}

fn val_loss(dir: &Path) -> f64 {
    support::values(dir, "val_loss")[0]
}

fn flags(out: &Path, name: &str, extra: &[&str]) -> GptArgs {
    let base = [
        "train",
        "--seq-len",
        "16",
        "--synthetic-tokens",
        "4096",
        "--val-tokens",
        "512",
        "--batch-size",
        "8",
        "--steps",
        "4",
        "--clip-grad-norm",
        "0.3",
        "--quiet",
        "--out",
        out.to_str().unwrap(),
        "--name",
        name,
    ];
    support::parse(base.into_iter().chain(extra.iter().copied()))
}

/// Losses, gradient norms, validation loss and final weights of run `b` equal run `a`'s.
fn assert_same_run(out: &Path, a: &str, b: &str) {
    let (x, y) = (step_lines(&out.join(a)), step_lines(&out.join(b)));
    assert_eq!(x.len(), 4, "{a}");
    assert_eq!(x.len(), y.len(), "{b}");
    for (step, (p, q)) in x.iter().zip(&y).enumerate() {
        let (lp, lq) = (p["loss"].as_f64().unwrap(), q["loss"].as_f64().unwrap());
        assert!((lp - lq).abs() < 1e-4, "{b} step {step}: loss {lp} vs {lq}");
        let (np, nq) = (
            p["grad_norm"].as_f64().unwrap(),
            q["grad_norm"].as_f64().unwrap(),
        );
        assert!(np > 0.3, "{a} step {step}: the clipping must act ({np})");
        assert!(
            (np - nq).abs() < 1e-4 * np,
            "{b} step {step}: norm {np} vs {nq}"
        );
    }
    let (va, vb) = (val_loss(&out.join(a)), val_loss(&out.join(b)));
    assert!((va - vb).abs() < 1e-4, "{b}: val loss {va} vs {vb}");
    let load = |run: &str| {
        candle_core::safetensors::load(out.join(run).join("model.safetensors"), &Device::Cpu)
            .unwrap()
    };
    let (wa, wb) = (load(a), load(b));
    assert_eq!(wa.len(), wb.len(), "{b}: the gathered checkpoint's tensors");
    for (name, value) in &wa {
        let other = wb.get(name).unwrap_or_else(|| panic!("{b} lacks {name}"));
        let diff = (value.to_dtype(DType::F64).unwrap() - other.to_dtype(DType::F64).unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        assert!(diff < 1e-4, "{b}: {name} differs by {diff}");
    }
}

/// Each stage's peak of activation bytes held, as logged at the first step.
fn activation_peaks(out: &Path, run: &str) -> Vec<u64> {
    let line = &step_lines(&out.join(run))[0];
    let bytes = line["peak_activation_bytes"].as_array().unwrap();
    bytes.iter().map(|p| p.as_u64().unwrap()).collect()
}

/// Each stage's peak of micro-batches in flight, as logged at the first step.
fn peaks(out: &Path, run: &str) -> Vec<u64> {
    let line = &step_lines(&out.join(run))[0];
    let bubble = line["bubble"].as_array().unwrap();
    assert_eq!(bubble.len(), 2, "{run}: one bubble per stage");
    let theory = line["bubble_theory"].as_f64().unwrap();
    assert!((theory - 1.0 / 5.0).abs() < 1e-12, "{run}: (P-1)/(M+P-1)");
    line["peak_micro_batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect()
}

#[test]
fn train_gpt_pp2_logs_the_losses_of_pp1() {
    let out = tempfile::tempdir().unwrap();
    let out = out.path();
    let micro = ["--micro-batches", "4"];
    weft_train::gpt::run(&flags(out, "pp1", &micro)).unwrap();
    for schedule in ["1f1b", "gpipe"] {
        let name = format!("pp2-{schedule}");
        let extra = [&micro[..], &["--pp", "2", "--schedule", schedule]].concat();
        run_on_thread_ranks(2, &flags(out, &name, &extra));
        assert_same_run(out, "pp1", &name);
    }
    // Stages cut by measured time (each rank times the blocks; the ranks average the times,
    // so they cut alike, whatever the cut is).
    let timed = [&micro[..], &["--pp", "2", "--pp-balance", "time"]].concat();
    run_on_thread_ranks(2, &flags(out, "pp2-time", &timed));
    assert_same_run(out, "pp1", "pp2-time");
    // Dropout: micro-batch i of step s draws the same masks on whichever stage computes it.
    let dropped = [&micro[..], &["--dropout", "0.1"]].concat();
    weft_train::gpt::run(&flags(out, "pp1-dropout", &dropped)).unwrap();
    let staged = [&dropped[..], &["--pp", "2"]].concat();
    run_on_thread_ranks(2, &flags(out, "pp2-dropout", &staged));
    assert_same_run(out, "pp1-dropout", "pp2-dropout");
    // Recomputed activations (checkpointed blocks draw their masks again from the seed), of
    // every block or of the attention halves alone, change nothing, in a pipeline too.
    let recomputed = [&staged[..], &["--checkpoint-activations"]].concat();
    run_on_thread_ranks(2, &flags(out, "pp2-dropout-recomputed", &recomputed));
    assert_same_run(out, "pp2-dropout", "pp2-dropout-recomputed");
    let selective = [&staged[..], &["--checkpoint-activations", "attention"]].concat();
    run_on_thread_ranks(2, &flags(out, "pp2-dropout-attention", &selective));
    assert_same_run(out, "pp2-dropout", "pp2-dropout-attention");
    let (a, b) = (
        step_lines(&out.join("pp1")),
        step_lines(&out.join("pp1-dropout")),
    );
    let moved = (a[1]["loss"].as_f64().unwrap() - b[1]["loss"].as_f64().unwrap()).abs();
    assert!(moved > 1e-3, "dropout changed nothing");
    // The gathered checkpoint initialises each stage with its blocks (and the last stage's copy
    // of the token table) as it initialises the whole model; the run folder stands for its
    // `model.safetensors` (its own `config.json` is weft's, not a Hugging Face shape).
    let init = out.join("pp2-1f1b");
    let init = init.to_str().unwrap();
    let from = [&micro[..], &["--init-from", init]].concat();
    weft_train::gpt::run(&flags(out, "from-pp1", &from)).unwrap();
    let staged = [&from[..], &["--pp", "2"]].concat();
    run_on_thread_ranks(2, &flags(out, "from-pp2", &staged));
    let first = |run: &str| step_lines(&out.join(run))[0]["loss"].as_f64().unwrap();
    assert!((first("from-pp1") - first("from-pp2")).abs() < 1e-5);
    assert!(
        first("from-pp1") < first("pp1") - 0.05,
        "trained weights were loaded"
    );
    assert_eq!(peaks(out, "pp2-1f1b"), [2, 1], "1F1B: min(P - s, M)");
    assert_eq!(peaks(out, "pp2-gpipe"), [4, 4], "GPipe: M");
    // Equal micro-batches keep equal tapes: 1F1B's first stage holds half of GPipe's.
    let (one, all) = (
        activation_peaks(out, "pp2-1f1b"),
        activation_peaks(out, "pp2-gpipe"),
    );
    assert!(one[0] > 0 && 2 * one[0] == all[0], "{one:?} vs {all:?}");
    assert!(4 * one[1] == all[1], "{one:?} vs {all:?}");
}

#[test]
fn zero2_and_zero3_over_dp2_tp2_equal_one_process() {
    let out = tempfile::tempdir().unwrap();
    let out = out.path();
    weft_train::gpt::run(&flags(out, "one", &[])).unwrap();
    // Gradients (and, under ZeRO-3, parameters) sharded over the 2 replicas of each
    // tensor-parallel slice; micro-batches reduced one by one into the shards; the tied token
    // table gathered for the head and again for the embedding.
    for zero in ["2", "3"] {
        let name = format!("dp2-tp2-zero{zero}");
        let mesh = [
            "--dp",
            "2",
            "--tp",
            "2",
            "--micro-batches",
            "2",
            "--zero",
            zero,
        ];
        run_on_thread_ranks(4, &flags(out, &name, &mesh));
        assert_same_run(out, "one", &name);
    }
}

#[test]
fn dp2_tp2_pp2_on_eight_ranks_equals_one_process() {
    let out = tempfile::tempdir().unwrap();
    let out = out.path();
    weft_train::gpt::run(&flags(out, "one", &[])).unwrap();
    let mesh = [
        "--dp",
        "2",
        "--tp",
        "2",
        "--pp",
        "2",
        "--micro-batches",
        "2",
    ];
    run_on_thread_ranks(8, &flags(out, "mesh", &mesh));
    assert_same_run(out, "one", "mesh");
    // ZeRO-1 over the dp axis: each replica steps half of its stage's optimizer state.
    let zero = [&mesh[..], &["--zero", "1"]].concat();
    run_on_thread_ranks(8, &flags(out, "mesh-zero1", &zero));
    assert_same_run(out, "one", "mesh-zero1");
}
