//! `train-gpt --model llama-tiny`: the Llama family as a task of the one training loop. Two
//! thread ranks under DDP and ZeRO 1/2/3 follow one process; a ZeRO-3 run resumed from its
//! checkpoint logs the uninterrupted losses; the exported Hugging Face folder initialises a run
//! by itself (no `--model`); the splits not built yet are one-line refusals.

use std::path::Path;

use candle_core::Device;
use weft_train::GptArgs;

mod support;
use support::{run, values};

fn flags(out: &Path, extra: &[&str]) -> GptArgs {
    let out = out.to_str().unwrap();
    let base = ["--model", "llama-tiny", "--out", out];
    support::tiny(&[&base[..], extra].concat())
}

/// Two replicas of two sequences each compute the one process's step on four: the same
/// losses within f32 rounding (1e-5 relative: the gradients are summed over ranks in another
/// order, the loss averaged from two halves).
#[test]
fn data_parallel_and_zero_follow_one_process() {
    let out = tempfile::tempdir().unwrap();
    run(&flags(out.path(), &["--name", "one"]), 1);
    let expected = values(&out.path().join("one"), "loss");
    assert_eq!(expected.len(), 5);
    assert!(expected[4] < expected[0], "{expected:?}");
    for zero in ["0", "1", "2", "3"] {
        let name = format!("zero{zero}");
        let layout = ["--nproc", "2", "--zero", zero, "--name", &name];
        run(&flags(out.path(), &layout), 2);
        let got = values(&out.path().join(&name), "loss");
        assert_eq!(got.len(), 5, "{name}");
        for (step, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert!(
                ((g - e) / e).abs() < 1e-5,
                "{name} step {step}: {g} against {e}"
            );
        }
    }
}

#[test]
fn a_zero3_run_resumes_to_the_uninterrupted_losses() {
    let out = tempfile::tempdir().unwrap();
    let layout = ["--nproc", "2", "--zero", "3"];
    let with = |more: &[&str]| flags(out.path(), &[&layout[..], more].concat());
    run(&with(&["--name", "straight"]), 2);
    run(&with(&["--name", "saved", "--save-every", "2"]), 2);
    let checkpoint = out.path().join("saved/checkpoints/step-00000002");
    run(
        &with(&["--name", "saved", "--resume", checkpoint.to_str().unwrap()]),
        2,
    );
    let expected = values(&out.path().join("straight"), "loss");
    assert_eq!(values(&out.path().join("saved"), "loss"), expected);
}

/// The final model is exported as a Hugging Face folder (`hf/`: `config.json` and the
/// weights); given to `--init-from` without `--model`, its `config.json` alone gives the
/// shape, and at a learning rate too small to move an f32 weight the run validates to the loss the first run ended on.
#[test]
fn the_exported_folder_initialises_a_run_by_itself() {
    let out = tempfile::tempdir().unwrap();
    run(&flags(out.path(), &["--name", "first"]), 1);
    let hf = out.path().join("first/hf");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(hf.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "LlamaForCausalLM");
    assert_eq!(config["num_key_value_heads"], 2);
    let saved = candle_core::safetensors::load(hf.join("model.safetensors"), &Device::Cpu);
    let saved = saved.unwrap();
    assert_eq!(
        saved["model.layers.1.mlp.down_proj.weight"].dims(),
        [64, 176]
    );
    assert!(!saved.contains_key("lm_head.weight"), "the head is tied");

    let mut again = flags(
        out.path(),
        &["--name", "again", "--lr", "1e-30", "--steps", "1"],
    );
    again.model.model = None;
    again.model.init_from = Some(hf.clone());
    run(&again, 1);
    let first = values(&out.path().join("first"), "val_loss");
    let second = values(&out.path().join("again"), "val_loss");
    assert_eq!(second.last(), first.last());
}

#[test]
fn splits_not_built_yet_and_bad_shapes_are_one_line_refusals() {
    let out = tempfile::tempdir().unwrap();
    let config = out.path().join("config.json");
    std::fs::write(&config, r#"{"model_type": "gpt2"}"#).unwrap();
    let config = config.to_str().unwrap();
    for (extra, expected) in [
        (
            &["--nproc", "2", "--tp", "2"][..],
            "--tp 2 --pp 1: llama-tiny",
        ),
        (
            &["--nproc", "2", "--pp", "2"][..],
            "--tp 1 --pp 2: llama-tiny",
        ),
        (&["--dropout", "0.1"][..], "--dropout 0.1: the Llama family"),
        (
            &["--model-config", config][..],
            "--model llama-tiny and --model-config",
        ),
        (
            &["--seq-len", "129"][..],
            "--seq-len 129 exceeds the context of 128",
        ),
    ] {
        let error = flags(out.path(), extra).validate().unwrap_err().to_string();
        assert!(error.contains(expected), "{extra:?}: {error}");
        assert!(!error.contains('\n'), "{error}");
    }
    let mut from_file = flags(out.path(), &["--model-config", config]);
    from_file.model.model = None;
    let error = from_file.validate().unwrap_err().to_string();
    assert!(
        error.contains(config) && error.contains("model_type"),
        "{error}"
    );
}
