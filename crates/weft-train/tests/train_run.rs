//! The ResNet trainer end to end on a tiny synthetic run: the run folder's files and their
//! contents, the checkpoint loading back, and one-line errors for bad flags.

use std::ops::Range;

use candle_core::{DType, Device, Tensor};
use clap::Parser;
use weft_models::{resnet, ResNetConfig};
use weft_tensor::Mode;
use weft_train::TrainArgs;

#[derive(Parser)]
#[command(args_override_self = true)]
struct Cli {
    #[command(flatten)]
    args: TrainArgs,
}

fn parse(extra: &[&str]) -> Result<TrainArgs, clap::Error> {
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
    Ok(Cli::try_parse_from(base.iter().chain(extra))?.args)
}

fn args(extra: &[&str]) -> TrainArgs {
    parse(extra).unwrap()
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

/// Mean cross-entropy, in training mode, of `model` on training samples `range` (no
/// augmentation, as `--augment none` prepares them).
fn loss_on_samples(model: &weft_tensor::BlockModel, a: &TrainArgs, range: Range<usize>) -> f64 {
    let data = weft_train::data::open(&a.data, a.model.num_classes, a.training.seed).unwrap();
    let mut images = Vec::new();
    let mut labels = Vec::new();
    for index in range.clone() {
        let sample = data.train.get(index).unwrap();
        let mut rng = weft_data::augmentation_rng(0, 0, index);
        images.extend(
            data.train_pipeline
                .apply(sample.image, &mut rng)
                .unwrap()
                .data,
        );
        labels.push(sample.label);
    }
    let n = range.len();
    let x = Tensor::from_vec(images, (n, 3, 8, 8), &Device::Cpu).unwrap();
    let y = Tensor::from_vec(labels, n, &Device::Cpu).unwrap();
    let logits = model.forward(&x, Mode::TRAIN).unwrap();
    weft_models::loss::cross_entropy(&logits, &y)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_scalar()
        .unwrap()
}

fn step_losses(run: &std::path::Path) -> Vec<f64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"].as_f64())
        .collect()
}

/// With `--augment none --shuffle false` step `s` trains on samples `s*B .. s*B+B` in order:
/// the loss logged at step 0 is the initial model's on samples 0..16, and the loss logged at
/// step 1 is the one-step model's (the checkpoint of a one-step run) on samples 16..32. A run
/// repeated gives the same losses.
#[test]
fn deterministic_mode_uses_samples_in_order_and_repeats_exactly() {
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().to_str().unwrap();
    let flags = |steps: &'static str, name: &'static str| -> TrainArgs {
        args(&[
            "--steps",
            steps,
            "--augment",
            "none",
            "--shuffle",
            "false",
            "--out",
            out_dir,
            "--name",
            name,
        ])
    };
    weft_train::resnet::run(&flags("2", "a")).unwrap();
    weft_train::resnet::run(&flags("2", "b")).unwrap();
    weft_train::resnet::run(&flags("1", "one-step")).unwrap();
    let logged = step_losses(&out.path().join("a"));
    assert_eq!(logged, step_losses(&out.path().join("b")));

    let config = ResNetConfig::from_name("resnet20", 10)
        .unwrap()
        .with_seed(0);
    let initial = resnet(&config, DType::F32, &Device::Cpu).unwrap();
    let expected = loss_on_samples(&initial, &flags("2", "a"), 0..16);
    let stepped = resnet(&config, DType::F32, &Device::Cpu).unwrap();
    let weights = out.path().join("one-step").join("model.safetensors");
    weft_tensor::state_dict::load_safetensors(stepped.store(), &weights).unwrap();
    let expected_next = loss_on_samples(&stepped, &flags("2", "a"), 16..32);
    // The trainer's forward (blocks without a graph) and the model's (Candle's graph) round
    // differently: 1e-5 allows for that, while other samples change the loss by far more.
    for (step, (got, want)) in logged.iter().zip([expected, expected_next]).enumerate() {
        assert!(
            (got - want).abs() <= 1e-5 * want.abs(),
            "step {step}: logged {got}, expected {want} from samples in order"
        );
    }
    let shifted = loss_on_samples(&initial, &flags("2", "a"), 1..17);
    assert!(
        (shifted - expected).abs() > 1e-3 * expected.abs(),
        "the check can fail"
    );
}

/// `--init-from` starts training from the given weights: a run initialised from another run's
/// checkpoint logs, at its first step, that checkpoint's loss, not a fresh model's.
#[test]
fn init_from_loads_the_weights() {
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().to_str().unwrap();
    let common = ["--augment", "none", "--shuffle", "false", "--out", out_dir];
    let run = |extra: &[&str]| {
        let mut flags: Vec<&str> = common.to_vec();
        flags.extend(extra);
        weft_train::resnet::run(&args(&flags)).unwrap()
    };
    run(&["--steps", "3", "--name", "trained"]);
    let weights = out.path().join("trained").join("model.safetensors");
    let weights = weights.to_str().unwrap();
    run(&["--steps", "1", "--name", "resumed", "--init-from", weights]);
    run(&["--steps", "1", "--name", "fresh"]);
    let trained = resnet(
        &ResNetConfig::from_name("resnet20", 10).unwrap(),
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    weft_tensor::state_dict::load_safetensors(trained.store(), std::path::Path::new(weights))
        .unwrap();
    let a = args(&common);
    let expected = loss_on_samples(&trained, &a, 0..16);
    let resumed = step_losses(&out.path().join("resumed"))[0];
    let fresh = step_losses(&out.path().join("fresh"))[0];
    assert!(
        (resumed - expected).abs() <= 1e-5 * expected.abs(),
        "{resumed} vs {expected}"
    );
    assert!(
        (fresh - expected).abs() > 1e-3 * expected.abs(),
        "{fresh} vs {expected}"
    );
}

#[test]
fn bad_flags_fail_before_any_work_naming_the_flag() {
    let cases: [(&[&str], &str); 13] = [
        (&["--model", "resnet7"], "--model resnet7"),
        (
            &["--checkpoint-activations", "attention"],
            "--checkpoint-activations attention: resnet",
        ),
        (&["--batch-size", "0"], "--batch-size"),
        (&["--data", "cifar10:/no/such/folder"], "/no/such/folder"),
        (&["--nproc", "3"], "not divisible by the 3 ranks"),
        (&["--init-from", "/no/such.safetensors"], "--init-from"),
        (&["--precision", "fp8"], "--precision"),
        (&["--precision", "bf16-true"], "--precision bf16-true"),
        (&["--micro-batches", "3"], "--micro-batches 3"),
        (&["--clip-grad-norm=-1"], "--clip-grad-norm"),
        (&["--last-bucket-cap-mb=-1"], "--last-bucket-cap-mb -1"),
        (
            &["--delayed-update-from", "40"],
            "needs --offload-optimizer",
        ),
        (
            &["--nproc", "2", "--tp", "2"],
            "a ResNet has no tensor-parallel or pipeline split",
        ),
    ];
    for (extra, expected) in cases {
        // A value clap's parser refuses (an enumeration's) fails in parsing, the rest in
        // validation; either way the line names the flag.
        let err = match parse(extra) {
            Ok(args) => args.validate().unwrap_err().to_string(),
            Err(e) => e.to_string().lines().next().unwrap().to_string(),
        };
        assert!(
            err.contains(expected),
            "{extra:?}: `{err}` lacks `{expected}`"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

/// `--channels-last` is `auto` by default (channels-last on a GPU, NCHW on
/// the CPU), `true` when given alone, and takes an explicit value; a bad value is refused.
#[test]
fn channels_last_defaults_to_the_devices_choice() {
    use weft_train::args::ChannelsLast;
    let cpu = Device::Cpu;
    assert_eq!(args(&[]).model.channels_last, ChannelsLast::Auto);
    assert!(!ChannelsLast::Auto.resolve(&cpu));
    assert_eq!(
        args(&["--channels-last"]).model.channels_last,
        ChannelsLast::True
    );
    assert!(ChannelsLast::True.resolve(&cpu));
    let off = args(&["--channels-last", "false"]).model.channels_last;
    assert_eq!(off, ChannelsLast::False);
    assert!(!off.resolve(&cpu));
    let bad = ["train", "--channels-last", "maybe"];
    assert!(Cli::try_parse_from(bad).is_err());
}

/// `--precision bf16-mixed` and `fp16-mixed` train a few steps on the CPU: finite losses near
/// the fp32 run's first (the same model rounded to 16 bits: within 1 %), the loss scale logged
/// on every fp16 step and the skipped steps counted per epoch; a bf16 checkpoint.
#[test]
fn mixed_precision_runs_log_their_loss_scale_and_skipped_steps() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().to_str().unwrap();
    let common = [
        "--steps",
        "3",
        "--augment",
        "none",
        "--shuffle",
        "false",
        "--out",
        dir,
    ];
    let run = |name: &str, precision: &str| {
        let extra: Vec<&str> = common
            .iter()
            .copied()
            .chain(["--name", name, "--precision", precision])
            .collect();
        weft_train::resnet::run(&args(&extra)).unwrap();
        let text = std::fs::read_to_string(out.path().join(name).join("metrics.jsonl")).unwrap();
        text.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .collect::<Vec<_>>()
    };
    let fp32 = run("fp32", "fp32");
    for precision in ["bf16-mixed", "fp16-mixed"] {
        let lines = run(precision, precision);
        let steps: Vec<_> = lines.iter().filter(|l| l.get("step").is_some()).collect();
        assert_eq!(steps.len(), 3, "{precision}");
        let (first, reference) = (
            steps[0]["loss"].as_f64().unwrap(),
            fp32[0]["loss"].as_f64().unwrap(),
        );
        assert!(
            (first - reference).abs() <= 0.01 * reference,
            "{precision}: {first} vs {reference}"
        );
        let epoch = lines.iter().find(|l| l.get("val_loss").is_some()).unwrap();
        assert!(
            epoch["val_loss"].as_f64().unwrap().is_finite(),
            "{precision}"
        );
        if precision == "fp16-mixed" {
            assert!(steps
                .iter()
                .all(|s| s["loss_scale"].as_f64().unwrap() > 0.0));
            assert_eq!(epoch["skipped_steps"], 0);
        } else {
            assert!(steps.iter().all(|s| s.get("loss_scale").is_none()));
            assert!(epoch.get("skipped_steps").is_none());
        }
    }
}

/// The default run (shuffled, augmented: every draw seeded) repeated on a pool of four threads
/// logs the same losses, bit for bit: no reduction's order depends on which thread ran what.
#[test]
fn a_run_repeated_on_four_threads_logs_the_same_losses() {
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().to_str().unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .build()
        .unwrap();
    let losses = |name: &'static str| {
        let flags = args(&[
            "--steps",
            "4",
            "--image-size",
            "16",
            "--batch-size",
            "32",
            "--out",
            out_dir,
            "--name",
            name,
        ]);
        pool.install(|| weft_train::resnet::run(&flags)).unwrap();
        step_losses(&out.path().join(name))
    };
    let first = losses("first");
    assert_eq!(first.len(), 4);
    assert_eq!(first, losses("second"));
    assert_eq!(first, losses("third"));
}

/// A diverging fp32 run (SGD at lr 1e30) ends with one line naming the step, and a diverging
/// fp16-mixed run once more steps in a row are skipped than `--max-skipped-steps` allows.
#[test]
fn a_diverging_run_stops_naming_the_step() {
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().to_str().unwrap();
    let fp32 = args(&[
        "--steps", "4", "--lr", "1e30", "--out", out_dir, "--name", "fp32",
    ]);
    let message = weft_train::resnet::run(&fp32).unwrap_err().to_string();
    assert!(
        message.starts_with("step 1: the loss is NaN: the run diverged"),
        "{message}"
    );
    let fp16 = args(&[
        "--steps",
        "12",
        "--lr",
        "1e30",
        "--precision",
        "fp16-mixed",
        "--max-skipped-steps",
        "2",
        "--out",
        out_dir,
        "--name",
        "fp16",
    ]);
    let message = weft_train::resnet::run(&fp16).unwrap_err().to_string();
    assert!(
        message.contains("3 steps in a row skipped for inf/NaN gradients"),
        "{message}"
    );
}

fn run_on_ranks(args: &TrainArgs, ranks: usize) {
    if ranks == 1 {
        weft_train::resnet::run(args).unwrap();
        return;
    }
    weft_testing::on_thread_ranks(ranks, |rank, comm| {
        let ctx = weft_train::distributed::RankContext {
            rank,
            world_size: ranks,
            comm: Some(comm as std::sync::Arc<_>),
        };
        weft_train::resnet::run_in(args, &ctx, &Device::Cpu).unwrap();
    });
}

/// A run resumed from its step-4 checkpoint (an epoch boundary: 4 batches per epoch), then from
/// its step-2 one (inside an epoch), logs the
/// uninterrupted run's losses, bit for bit, shuffled and augmented, in one process and on two
/// thread ranks under DDP and each ZeRO stage; its epoch lines are the uninterrupted run's too.
#[test]
fn resumed_runs_log_the_uninterrupted_losses() {
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().to_str().unwrap();
    for (case, ranks, zero) in [
        ("one", 1, "0"),
        ("bf16", 1, "0"),
        ("ddp", 2, "0"),
        ("zero1", 2, "1"),
        ("zero2", 2, "2"),
        ("zero3", 2, "3"),
    ] {
        let nproc = ranks.to_string();
        let flags = |name: &str, more: &[&str]| {
            let mut extra = vec!["--steps", "6", "--out", out_dir, "--name", name];
            extra.extend(["--nproc", &nproc, "--zero", zero]);
            if case == "bf16" {
                // The fp32 master copy differs from the bf16 model: the checkpoint carries it.
                extra.extend(["--precision", "bf16-mixed"]);
            }
            extra.extend_from_slice(more);
            args(&extra)
        };
        let (straight, saved) = (format!("{case}-straight"), format!("{case}-saved"));
        run_on_ranks(&flags(&straight, &[]), ranks);
        run_on_ranks(&flags(&saved, &["--save-every", "2"]), ranks);
        let lines = |name: &str| -> Vec<serde_json::Value> {
            std::fs::read_to_string(out.path().join(name).join("metrics.jsonl"))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        };
        let pick = |lines: &[serde_json::Value], key: &str| -> Vec<f64> {
            lines.iter().filter_map(|l| l.get(key)?.as_f64()).collect()
        };
        // Step 4 ends an epoch; step 2 is inside one (the second resume discards step 4's).
        for from in ["step-00000004", "step-00000002"] {
            let checkpoint = out.path().join(&saved).join("checkpoints").join(from);
            let resume = ["--resume", checkpoint.to_str().unwrap()];
            run_on_ranks(&flags(&saved, &resume), ranks);
            let (a, b) = (lines(&straight), lines(&saved));
            assert_eq!(pick(&a, "loss").len(), 6, "{case}");
            for key in ["loss", "train_loss", "train_acc", "val_loss", "val_acc"] {
                assert_eq!(pick(&a, key), pick(&b, key), "{case} from {from}: {key}");
            }
        }
    }
}

/// Two ranks stream their timelines and rank 0 merges them: `trace.json` holds one process per
/// rank with every step's forward, backward, bucket all-reduces and update.
#[test]
fn two_ranks_write_one_merged_trace() {
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().to_str().unwrap();
    let extra = ["--steps", "3", "--out", out_dir, "--name", "traced"];
    run_on_ranks(&args(&[&extra[..], &["--nproc", "2"]].concat()), 2);
    let run = out.path().join("traced");
    let merged = weft_tensor::timeline::chrome::read_events(&run.join("trace.json")).unwrap();
    for rank in 0..2 {
        let own: Vec<_> = merged
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == rank)
            .collect();
        let count = |cat: &str| own.iter().filter(|e| e["cat"] == cat).count();
        assert_eq!(count("optimizer"), 3, "rank {rank}: one update per step");
        assert!(
            count("forward") >= 3 && count("backward") >= 3,
            "rank {rank}"
        );
        assert!(count("allreduce") >= 3, "rank {rank}: bucket all-reduces");
        // Each rank's own file is complete JSON and holds the same spans.
        let text = std::fs::read_to_string(run.join(format!("trace-rank{rank}.json"))).unwrap();
        let whole: serde_json::Value = serde_json::from_str(&text).unwrap();
        let spans = whole.as_array().unwrap().iter().filter(|e| e["ph"] == "X");
        assert_eq!(spans.count(), own.len(), "rank {rank}");
    }
}

/// Epochs follow the sampler: 110 samples on 4 ranks pad to 28 each, 14 batches of 2 per rank,
/// so every epoch is 14 steps (not 110 / 8 = 13, which let the second epoch run short).
#[test]
fn every_epoch_is_the_samplers_number_of_steps() {
    let out = tempfile::tempdir().unwrap();
    let flags = [
        "--synthetic-train",
        "110",
        "--batch-size",
        "8",
        "--nproc",
        "4",
        "--epochs",
        "2",
        "--name",
        "epochs",
        "--out",
        out.path().to_str().unwrap(),
    ];
    run_on_ranks(&args(&flags), 4);
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(out.path().join("epochs/metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    let steps_in = |epoch: u64| {
        lines
            .iter()
            .filter(|l| l.get("step").is_some() && l["epoch"] == epoch)
            .count()
    };
    assert_eq!((steps_in(0), steps_in(1)), (14, 14));
}

/// `--sync-bn` on two thread ranks (through `parallelize::resnet`) trains as one process does on the same global batches: the logged losses agree to f32
/// rounding (the two runs sum each batch in different orders: 1e-4 relative holds it).
#[test]
fn sync_bn_on_two_ranks_trains_as_one_process() {
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().to_str().unwrap();
    let flags = |name: &str, more: &[&str]| {
        let base = [
            "--steps",
            "3",
            "--augment",
            "none",
            "--out",
            out_dir,
            "--name",
            name,
        ];
        args(&[&base[..], more].concat())
    };
    run_on_ranks(&flags("one", &[]), 1);
    run_on_ranks(&flags("synced", &["--nproc", "2", "--sync-bn"]), 2);
    let losses = |name: &str| -> Vec<f64> {
        std::fs::read_to_string(out.path().join(name).join("metrics.jsonl"))
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["loss"].as_f64())
            .collect()
    };
    let (one, synced) = (losses("one"), losses("synced"));
    assert_eq!(one.len(), 3);
    weft_testing::assert_close_each(&synced, &one, 1e-4);
}
