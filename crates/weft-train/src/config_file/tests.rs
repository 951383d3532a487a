//! `--config` files against the trainers' own flags: TOML at the top level and in sections,
//! JSON, the command line winning, and one-line errors for an unknown key, a key in another
//! section and a bad value.

use std::ffi::OsString;

use clap::{CommandFactory, Parser, Subcommand};

use super::*;
use crate::flags::{OptimizerKind, Precision, Recompute};
use crate::{GptArgs, TrainArgs};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)]
enum Task {
    TrainResnet(TrainArgs),
    TrainGpt(GptArgs),
}

fn write(text: &str, name: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    let path = path.to_str().unwrap().to_string();
    (dir, path)
}

fn argv(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// The flags `args` parse to, the config file expanded.
fn parse(args: &[&str]) -> Result<Task> {
    let expanded = expand(&Cli::command(), argv(args))?;
    Ok(Cli::try_parse_from(expanded)?.command)
}

fn gpt(args: &[&str]) -> GptArgs {
    match parse(args).unwrap() {
        Task::TrainGpt(args) => args,
        Task::TrainResnet(_) => panic!("a GPT command"),
    }
}

#[test]
fn toml_keys_set_flags_at_the_top_level_and_in_sections() {
    let (_dir, path) = write(
        "model = \"gpt-tiny\"\nbatch_size = 8\n[optimizer]\nlr = 0.01\noptimizer = \"sgd\"\n\
         [parallelism]\npp-split = [2, 2]\ncuda-graph = false\n[training]\ncheckpoint-activations = true\n",
        "run.toml",
    );
    let args = gpt(&["xtask", "train-gpt", "--config", &path]);
    assert_eq!(args.training.batch_size, 8);
    assert_eq!(args.optim.lr, 0.01);
    assert_eq!(args.optim.optimizer, OptimizerKind::Sgd);
    assert_eq!(args.parallel.pp_split, Some(vec![2, 2]));
    assert!(!args.parallel.cuda_graph);
    // A run folder's config.json of before the recompute modes said `true`.
    assert_eq!(args.training.checkpoint_activations, Recompute::Full);
    let (_dir, path) = write("checkpoint-activations = \"attention\"\n", "run.toml");
    let args = gpt(&["xtask", "train-gpt", "--config", &path]);
    assert_eq!(args.training.checkpoint_activations, Recompute::Attention);
    let args = gpt(&[
        "xtask",
        "train-gpt",
        "--checkpoint-activations",
        "--steps",
        "3",
    ]);
    assert_eq!(args.training.checkpoint_activations, Recompute::Full);
}

#[test]
fn the_command_line_wins_over_the_file() {
    let (_dir, path) = write("batch-size = 8\nprecision = \"bf16-mixed\"\n", "run.toml");
    let args = gpt(&["xtask", "train-gpt", "--batch-size", "4", "--config", &path]);
    assert_eq!(args.training.batch_size, 4);
    assert_eq!(args.precision.precision, Precision::Bf16Mixed);
    let args = gpt(&[
        "xtask",
        "train-gpt",
        &format!("--config={path}"),
        "--batch-size=2",
    ]);
    assert_eq!(args.training.batch_size, 2);
}

/// A run's `config.json` read back as `--config` gives the same flags: serialised again, the
/// same JSON.
#[test]
fn a_run_config_json_round_trips() {
    let first = gpt(&[
        "xtask",
        "train-gpt",
        "--batch-size",
        "4",
        "--pp-split",
        "1,3",
        "--lr",
        "0.02",
    ]);
    let json = serde_json::to_string_pretty(&first).unwrap();
    let (_dir, path) = write(&json, "config.json");
    let again = gpt(&["xtask", "train-gpt", "--config", &path]);
    assert_eq!(
        serde_json::to_value(&again).unwrap(),
        serde_json::to_value(&first).unwrap()
    );
}

#[test]
fn unknown_keys_other_sections_and_bad_values_are_one_line_errors() {
    let cases = [
        ("batch-sise = 3\n", "unknown key 'batch-sise'"),
        (
            "[optimizer]\nbatch-size = 3\n",
            "[optimizer] batch-size: --batch-size belongs to [training]",
        ),
        ("batch-size = \"many\"\n", "batch-size = many"),
        ("precision = \"fp8\"\n", "precision = fp8"),
        ("config = \"x.toml\"\n", "unknown key 'config'"),
        ("batch-size = [1, [2]]\n", "batch-size: expected a value"),
        ("not toml at all [\n", "not TOML"),
    ];
    for (text, expected) in cases {
        let (_dir, path) = write(text, "bad.toml");
        let error = parse(&["xtask", "train-gpt", "--config", &path])
            .err()
            .expect("refused")
            .to_string();
        assert!(
            error.contains(expected) && error.contains(&path),
            "{text:?}: {error}"
        );
        assert_eq!(error.lines().count(), 1, "{error}");
    }
    let error = parse(&["xtask", "train-gpt", "--config", "/no/such.toml"])
        .err()
        .unwrap();
    assert!(format!("{error:#}").contains("/no/such.toml"));
}

/// Without `--config` the command line is untouched; the ResNet trainer reads its own flags.
#[test]
fn other_commands_and_trainers_parse_as_before() {
    let plain = argv(&["xtask", "train-resnet", "--lr", "0.5"]);
    assert_eq!(expand(&Cli::command(), plain.clone()).unwrap(), plain);
    let (_dir, path) = write("model = \"resnet32\"\nsync-bn = true\n", "r.toml");
    match parse(&["xtask", "train-resnet", "--config", &path]).unwrap() {
        Task::TrainResnet(args) => {
            assert_eq!(args.model.model, "resnet32");
            assert!(args.parallel.sync_bn);
            assert_eq!(args.optim.lr, 0.1);
        }
        Task::TrainGpt(_) => panic!("a ResNet command"),
    }
}

/// `--resume PATH` takes the run's `config.json` values for the flags given neither on the
/// command line nor in `--config`; given ones win.
#[test]
fn a_resumed_command_takes_the_checkpoints_flags_it_does_not_give() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let step = run.join("checkpoints/step-00000001");
    std::fs::create_dir_all(&step).unwrap();
    std::fs::write(step.join("progress.json"), r#"{"step": 1}"#).unwrap();
    let saved = r#"{"model": "gpt-tiny", "batch-size": 8, "lr": 0.02, "resume": null, "seed": 3}"#;
    std::fs::write(run.join("config.json"), saved).unwrap();
    let (_file, config) = write("seed = 5\n", "more.toml");
    let run = run.to_str().unwrap();
    let args = gpt(&[
        "xtask",
        "train-gpt",
        "--resume",
        run,
        "--lr",
        "0.5",
        "--config",
        &config,
    ]);
    assert_eq!(args.training.batch_size, 8);
    assert_eq!(args.optim.lr, 0.5);
    assert_eq!(args.training.seed, 5);
}
