//! `train-gpt --model llama-tiny`: the Llama family as a task of the one training loop. Two
//! thread ranks under DDP and ZeRO 1/2/3 follow one process, and so do pipeline stages (tied
//! and untied heads, 1F1B and GPipe, a data × pipeline mesh); a ZeRO-3 run resumed from its
//! checkpoint logs the uninterrupted losses; the exported Hugging Face folder initialises a run
//! by itself (no `--model`); layouts the shape cannot take are one-line refusals. Tensor
//! parallelism: `llama_tensor_parallel.rs`.

use candle_core::Device;

mod support;
use support::{llama_tiny as flags, losses_and_export, run, values};

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
    // Recomputing the attention halves changes nothing (bit for bit).
    let selective = [
        "--name",
        "attention",
        "--checkpoint-activations",
        "attention",
    ];
    run(&flags(out.path(), &selective), 1);
    assert_eq!(values(&out.path().join("attention"), "loss"), expected);
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

/// Pipeline stages log the one-process losses and end with its weights, within 1e-4 (f32: the
/// tied table's two gradients summed across the stages after accumulation, the micro-batches'
/// sums in another order; AdamW's normalised update passes the 1e-7 differences on): two
/// stages under 1F1B and GPipe over 4 micro-batches, an untied head (a `--model-config` shape),
/// the balance measured by time, and two replicas of two stages under ZeRO-1.
#[test]
fn pipeline_stages_follow_one_process() {
    let out = tempfile::tempdir().unwrap();
    let config = out.path().join("config.json");
    std::fs::write(
        &config,
        r#"{"model_type": "llama", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 64, "tie_word_embeddings": false}"#,
    )
    .unwrap();
    let untied = ["--model-config", config.to_str().unwrap()];
    let micro = ["--batch-size", "8", "--micro-batches", "4", "--steps", "4"];
    let cases: [(&str, &[&str], usize, &[&str]); 5] = [
        ("1f1b", &[], 2, &["--nproc", "2", "--pp", "2"]),
        (
            "gpipe",
            &[],
            2,
            &["--nproc", "2", "--pp", "2", "--schedule", "gpipe"],
        ),
        ("untied", &untied, 2, &["--nproc", "2", "--pp", "2"]),
        (
            "timed",
            &[],
            2,
            &["--nproc", "2", "--pp", "2", "--pp-balance", "time"],
        ),
        (
            "mesh",
            &[],
            4,
            &["--nproc", "4", "--dp", "2", "--pp", "2", "--zero", "1"],
        ),
    ];
    for (name, model, ranks, layout) in cases {
        let mut whole = flags(
            out.path(),
            &[&micro[..], model, &["--name", &format!("{name}-one")]].concat(),
        );
        let mut split = flags(
            out.path(),
            &[&micro[..], model, layout, &["--name", name]].concat(),
        );
        if !model.is_empty() {
            whole.model.model = None;
            split.model.model = None;
        }
        run(&whole, 1);
        run(&split, ranks);
        let (expected, weights) = losses_and_export(out.path(), &format!("{name}-one"));
        let (got, split_weights) = losses_and_export(out.path(), name);
        assert_eq!(got.len(), 4, "{name}");
        for (step, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert!(
                ((g - e) / e).abs() < 1e-4,
                "{name} step {step}: {g} against {e}"
            );
        }
        assert_eq!(weights.len(), split_weights.len(), "{name}");
        for (key, value) in &weights {
            let other = &split_weights[key];
            let diff = (value - other).unwrap().abs().unwrap().max_all().unwrap();
            assert!(diff.to_scalar::<f32>().unwrap() < 1e-4, "{name}: {key}");
        }
    }
}

/// A run resumed from its step-2 checkpoint logs the uninterrupted losses bit for bit, under
/// ZeRO-3 and under two pipeline stages.
#[test]
fn resumed_runs_log_the_uninterrupted_losses() {
    let out = tempfile::tempdir().unwrap();
    for (case, layout) in [
        ("zero3", ["--nproc", "2", "--zero", "3"]),
        ("pp2", ["--nproc", "2", "--pp", "2"]),
    ] {
        let with = |more: &[&str]| flags(out.path(), &[&layout[..], more].concat());
        let (straight, saved) = (format!("{case}-straight"), format!("{case}-saved"));
        run(&with(&["--name", &straight]), 2);
        run(&with(&["--name", &saved, "--save-every", "2"]), 2);
        let checkpoint = out.path().join(&saved).join("checkpoints/step-00000002");
        let resume = ["--name", &saved, "--resume", checkpoint.to_str().unwrap()];
        run(&with(&resume), 2);
        let expected = values(&out.path().join(&straight), "loss");
        assert_eq!(values(&out.path().join(&saved), "loss"), expected, "{case}");
    }
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
fn splits_the_shape_cannot_take_and_bad_shapes_are_one_line_refusals() {
    let out = tempfile::tempdir().unwrap();
    let config = out.path().join("config.json");
    std::fs::write(&config, r#"{"model_type": "gpt2"}"#).unwrap();
    let config = config.to_str().unwrap();
    for (extra, expected) in [
        (
            &["--nproc", "4", "--tp", "4"][..],
            "--tp 4 does not divide the 2 key/value heads",
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
