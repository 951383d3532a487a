//! The GPT trainer end to end on tiny runs: the run folder's lines, the Hugging Face checkpoint
//! loading back, text data, and one-line errors for bad flags.

use candle_core::{DType, Device};
use clap::Parser;
use weft_models::gpt::{self, hf};
use weft_train::GptArgs;

#[derive(Parser)]
#[command(args_override_self = true)]
struct Cli {
    #[command(flatten)]
    args: GptArgs,
}

fn args(extra: &[&str]) -> GptArgs {
    let base = [
        "train",
        "--seq-len",
        "16",
        "--synthetic-tokens",
        "2048",
        "--val-tokens",
        "256",
        "--batch-size",
        "4",
        "--quiet",
    ];
    Cli::parse_from(base.iter().chain(extra)).args
}

fn lines(dir: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn tiny_run_logs_tokens_per_second_and_writes_a_hugging_face_checkpoint() {
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().to_str().unwrap();
    let run = args(&["--steps", "3", "--out", out_dir, "--name", "g"]);
    let summary = weft_train::gpt::run(&run).unwrap();
    assert_eq!(summary.steps, 3);
    // A uniform guess over 256 tokens costs ln 256 = 5.545 nats; the first step is near it.
    assert!(
        (summary.first_loss - 256f64.ln()).abs() < 0.1,
        "{}",
        summary.first_loss
    );
    let dir = out.path().join("g");
    let lines = lines(&dir);
    let steps: Vec<_> = lines.iter().filter(|l| l.get("step").is_some()).collect();
    assert_eq!(steps.len(), 3);
    for (i, s) in steps.iter().enumerate() {
        assert_eq!(s["step"], i);
        assert!(s["loss"].as_f64().unwrap().is_finite());
        assert!(s["lr"].as_f64().unwrap() > 0.0);
        assert!(s["tokens_per_sec"].as_f64().unwrap() > 0.0);
    }
    let epoch = lines.iter().find(|l| l.get("val_loss").is_some()).unwrap();
    assert!(epoch["val_loss"].as_f64().unwrap().is_finite());
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    // The default model is left unset, as the command left it.
    assert!(config["model"].is_null(), "{config}");

    // The checkpoint has Hugging Face's layout and loads into a fresh model.
    let weft_train::language_model::LanguageModel::Gpt(model_config) = run.model_config().unwrap()
    else {
        panic!("train-gpt's default model is a GPT");
    };
    let saved =
        candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    assert_eq!(saved["transformer.wte.weight"].dims(), [256, 64]);
    let fresh = gpt::gpt(
        &model_config.clone().with_seed(99),
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    hf::load_hf_safetensors(fresh.store(), &model_config, &dir.join("model.safetensors")).unwrap();
    let trained = fresh
        .store()
        .get("transformer.h.0.mlp.c_fc.weight")
        .unwrap()
        .tensor();
    let reference = &saved["transformer.h.0.mlp.c_fc.weight"];
    let diff = (trained - reference)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap();
    assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0);
}

#[test]
fn text_files_train_as_bytes() {
    let out = tempfile::tempdir().unwrap();
    let text = out.path().join("corpus.txt");
    std::fs::write(
        &text,
        "the quick brown fox jumps over the lazy dog. ".repeat(40),
    )
    .unwrap();
    let data = format!("text:{}", text.display());
    let out_dir = out.path().to_str().unwrap();
    let summary = weft_train::gpt::run(&args(&[
        "--data", &data, "--steps", "2", "--out", out_dir, "--name", "t",
    ]))
    .unwrap();
    assert_eq!(summary.steps, 2);
    assert!(summary.loss_floor.is_none());
    assert!(summary.final_val_loss.is_finite());
}

#[test]
fn bad_flags_are_one_line_errors_naming_the_flag() {
    for (flags, expected) in [
        (&["--seq-len", "500"][..], "--seq-len 500"),
        (&["--model", "gpt3"][..], "--model"),
        (
            &["--data", "text:/no/such/file"][..],
            "--data text:/no/such/file",
        ),
        (&["--data", "images"][..], "--data images"),
        (&["--dropout", "1.5"][..], "--dropout 1.5"),
        (
            &["--batch-size", "4", "--micro-batches", "3"][..],
            "--micro-batches 3",
        ),
        (
            &["--tp", "3", "--nproc", "3", "--batch-size", "3"][..],
            "--tp 3 does not divide the 4 attention heads of gpt-tiny",
        ),
        (
            &["--tp", "2", "--nproc", "3"][..],
            "--tp 2 x --pp 1 must divide the 3 ranks",
        ),
        (
            &["--pp", "11"][..],
            "--pp 11 exceeds the 10 blocks of gpt-tiny",
        ),
        (
            &["--dp", "2", "--tp", "2", "--pp", "2", "--nproc", "4"][..],
            "--dp 2 x --tp 2 x --pp 2 = 8 ranks, but --nproc is 4",
        ),
        (
            &["--pp", "2", "--batch-size", "4", "--micro-batches", "3"][..],
            "--micro-batches 3 must divide the per-rank batch of 4",
        ),
        (
            &["--pp", "2", "--zero", "2"][..],
            "--zero 2 is not supported with --pp 2",
        ),
        (
            &["--pp", "2", "--pp-split", "1,2"][..],
            "the split [1, 2] covers 3 blocks, the model has 10",
        ),
        (
            &["--pp", "2", "--pp-split", "6"][..],
            "--pp-split [6] has 1 stages",
        ),
        (&["--sync-bn"][..], "--sync-bn: a GPT has no batch norm"),
        (
            &["--offload-optimizer"][..],
            "--offload-optimizer: the model is on the CPU already",
        ),
    ] {
        let err = args(flags).validate().unwrap_err().to_string();
        assert!(err.contains(expected), "{flags:?}: {err}");
        assert!(!err.contains('\n'), "{err}");
    }
}

/// A run folder's `config.json` given back as `--config` (another `--name`) trains the same
/// run: the same losses, bit for bit on the CPU. Every metric line carries its type and time.
#[test]
fn a_runs_config_json_reproduces_its_losses() {
    use clap::{CommandFactory, Subcommand};
    #[derive(Parser)]
    struct Top {
        #[command(subcommand)]
        command: Command,
    }
    #[derive(Subcommand)]
    enum Command {
        TrainGpt(GptArgs),
    }
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().to_str().unwrap();
    let first = args(&[
        "--steps", "3", "--lr", "0.01", "--out", out_dir, "--name", "a",
    ]);
    weft_train::gpt::run(&first).unwrap();
    let config = out.path().join("a/config.json");
    let argv = [
        "xtask",
        "train-gpt",
        "--config",
        config.to_str().unwrap(),
        "--name",
        "b",
    ];
    let argv = argv.iter().map(std::ffi::OsString::from).collect();
    let argv = weft_train::config_file::expand(&Top::command(), argv).unwrap();
    let Command::TrainGpt(again) = Top::parse_from(argv).command;
    assert_eq!(again.optim.lr, 0.01);
    weft_train::gpt::run(&again).unwrap();
    let losses = |name: &str| -> Vec<f64> {
        let lines = lines(&out.path().join(name));
        for line in &lines {
            assert!(line["type"] == "step" || line["type"] == "epoch", "{line}");
            assert!(line["time"].as_f64().unwrap() > 1.7e9, "{line}");
        }
        lines
            .iter()
            .filter_map(|l| l.get("loss")?.as_f64())
            .collect()
    };
    assert_eq!(losses("b"), losses("a"));
    assert_eq!(losses("a").len(), 3);
}
