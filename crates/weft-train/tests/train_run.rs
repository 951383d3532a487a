//! The ResNet trainer end to end on a tiny synthetic run: the run folder's files and their
//! contents, the checkpoint loading back, and one-line errors for bad flags.

use candle_core::{DType, Device};
use clap::Parser;
use weft_models::{resnet, ResNetConfig};
use weft_train::TrainArgs;

#[derive(Parser)]
#[command(args_override_self = true)]
struct Cli {
    #[command(flatten)]
    args: TrainArgs,
}

fn args(extra: &[&str]) -> TrainArgs {
    let base = [
        "train",
        "--model",
        "resnet20",
        "--image-size",
        "8",
        "--synthetic-train",
        "64",
        "--synthetic-val",
        "24",
        "--batch-size",
        "16",
        "--workers",
        "0",
        "--quiet",
    ];
    Cli::parse_from(base.iter().chain(extra)).args
}

#[test]
fn tiny_run_writes_metrics_config_and_a_loadable_checkpoint() {
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().to_str().unwrap();
    let summary =
        weft_train::resnet::run(&args(&["--steps", "3", "--out", out_dir, "--name", "t"])).unwrap();
    assert_eq!(summary.steps, 3);
    let dir = out.path().join("t");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let steps: Vec<_> = lines.iter().filter(|l| l.get("step").is_some()).collect();
    assert_eq!(steps.len(), 3);
    for (i, s) in steps.iter().enumerate() {
        assert_eq!(s["step"], i);
        assert!(s["loss"].as_f64().unwrap().is_finite());
        assert!(s["lr"].as_f64().unwrap() > 0.0);
        assert!(s["images_per_sec"].as_f64().unwrap() > 0.0);
    }
    let epoch = lines
        .iter()
        .find(|l| l.get("val_acc").is_some())
        .expect("an epoch line");
    for key in ["epoch", "train_loss", "train_acc", "val_loss", "val_acc"] {
        assert!(epoch.get(key).is_some(), "epoch line lacks {key}");
    }
    assert!((0.0..=1.0).contains(&epoch["val_acc"].as_f64().unwrap()));
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model"], "resnet20");
    assert!(dir.join("checkpoint.json").exists() && dir.join("trace-rank0.json").exists());
    let model = resnet(
        &ResNetConfig::from_name("resnet20", 10).unwrap(),
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    weft_tensor::state_dict::load_safetensors(model.store(), &dir.join("model.safetensors"))
        .unwrap();
}

#[test]
fn deterministic_mode_uses_samples_in_order_and_repeats_exactly() {
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().to_str().unwrap();
    let flags = |name: &'static str| -> Vec<&str> {
        vec![
            "--steps",
            "2",
            "--augment",
            "none",
            "--shuffle",
            "false",
            "--out",
            out_dir,
            "--name",
            name,
        ]
    };
    weft_train::resnet::run(&args(&flags("a"))).unwrap();
    weft_train::resnet::run(&args(&flags("b"))).unwrap();
    let losses = |name: &str| -> Vec<f64> {
        std::fs::read_to_string(out.path().join(name).join("metrics.jsonl"))
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"].as_f64())
            .collect()
    };
    assert_eq!(losses("a"), losses("b"));
}

#[test]
fn bad_flags_fail_before_any_work_naming_the_flag() {
    let cases: [(&[&str], &str); 5] = [
        (&["--model", "resnet7"], "--model resnet7"),
        (&["--batch-size", "0"], "--batch-size"),
        (&["--data", "cifar10:/no/such/folder"], "/no/such/folder"),
        (&["--nproc", "3"], "not divisible by --nproc 3"),
        (&["--init-from", "/no/such.safetensors"], "--init-from"),
    ];
    for (extra, expected) in cases {
        let err = args(extra).validate().unwrap_err().to_string();
        assert!(
            err.contains(expected),
            "{extra:?}: `{err}` lacks `{expected}`"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}
