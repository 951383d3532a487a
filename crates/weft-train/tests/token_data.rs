//! `train-gpt`'s real tokens: text tokenized by `--tokenizer gpt2` (a fresh model takes its
//! 50,257-token vocabulary), pre-tokenized shards (`--data tokens:PATTERN`, the `val` shard
//! validating, every window evaluated), and the one-line refusals: a shard with a token beyond
//! the model's vocabulary (naming the file), a tokenizer for data it does not tokenize, and
//! weights whose vocabulary the data do not fit.

use std::path::Path;

use weft_data::token_shards::write_shard;

mod support;
use support::{run, values};

fn flags(out: &Path, extra: &[&str]) -> weft_train::GptArgs {
    let base = [
        "--model",
        "llama-tiny",
        "--out",
        out.to_str().unwrap(),
        "--steps",
        "2",
    ];
    support::tiny(&[&base[..], extra].concat())
}

#[test]
fn tokenized_text_trains_a_model_of_the_tokenizers_vocabulary() {
    let out = tempfile::tempdir().unwrap();
    let text = out.path().join("corpus.txt");
    std::fs::write(&text, "Héllo wörld, the quick brown fox. ".repeat(40)).unwrap();
    let data = format!("text:{}", text.display());
    let args = flags(
        out.path(),
        &["--data", &data, "--tokenizer", "gpt2", "--name", "t"],
    );
    assert_eq!(args.model_config().unwrap().vocab_size(), 50_257);
    run(&args, 1);
    let losses = values(&out.path().join("t"), "loss");
    // A fresh model's first loss is near ln(50257) = 10.8 nats: the tokenizer's ids were read.
    assert!((losses[0] - 50_257f64.ln()).abs() < 0.5, "{losses:?}");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("t/hf/config.json")).unwrap())
            .unwrap();
    assert_eq!(config["vocab_size"], 50_257);
}

#[test]
fn shards_train_and_every_validation_window_is_evaluated() {
    let out = tempfile::tempdir().unwrap();
    let shards = out.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    let tokens = |n: usize, seed: usize| -> Vec<u32> {
        (0..n)
            .map(|i| ((i * 31 + seed * 17) % 256) as u32)
            .collect()
    };
    write_shard(
        &shards.join("s_val_000000.bin"),
        &tokens(16 * 5 + 1, 0),
        256,
    )
    .unwrap();
    write_shard(&shards.join("s_train_000001.bin"), &tokens(200, 1), 256).unwrap();
    write_shard(&shards.join("s_train_000002.bin"), &tokens(150, 2), 256).unwrap();
    let data = format!("tokens:{}/s_*.bin", shards.display());
    let args = flags(out.path(), &["--data", &data, "--name", "run"]);
    let data_set = weft_train::gpt_data::open_data(&args, &args.model_config().unwrap(), 16);
    let data_set = data_set.unwrap();
    // Windows of 16 + 1 tokens: (200 - 1) / 16 + (150 - 1) / 16 training, 5 validating.
    assert_eq!((data_set.train.len(), data_set.val.len()), (12 + 9, 5));
    run(&args, 1);
    let val = values(&out.path().join("run"), "val_loss");
    assert!(val.last().unwrap().is_finite());

    write_shard(&shards.join("s_train_000003.bin"), &[1, 2, 3, 700], 1000).unwrap();
    let error = args.validate().and_then(|()| {
        weft_train::gpt_data::open_data(&args, &args.model_config()?, 16).map(|_| ())
    });
    let error = error.unwrap_err().to_string();
    assert!(
        error.contains("s_train_000003.bin") && error.contains("token 700"),
        "{error}"
    );
    assert!(!error.contains('\n'), "{error}");
}

#[test]
fn tokenizers_and_vocabularies_that_do_not_fit_are_refused_in_one_line() {
    let out = tempfile::tempdir().unwrap();
    let text = out.path().join("corpus.txt");
    std::fs::write(&text, "some text ".repeat(100)).unwrap();
    let data = format!("text:{}", text.display());
    // A model with GPT-2's vocabulary reading bytes: its ids would not be bytes.
    let hub = out.path().join("gpt2.safetensors");
    std::fs::write(&hub, b"").unwrap();
    let hub = hub.to_str().unwrap();
    for (extra, says) in [
        (
            &["--tokenizer", "gpt2"][..],
            "--tokenizer gpt2: tokenizes --data text:PATH",
        ),
        (
            &["--model", "gpt2", "--data", &data, "--init-from", hub][..],
            "the model's vocabulary has 50257 tokens; --data text: reads bytes",
        ),
        (
            &[
                "--model",
                "gpt-tiny",
                "--data",
                &data,
                "--tokenizer",
                "gpt2",
                "--init-from",
                hub,
            ][..],
            "the model's vocabulary has 256 tokens; --tokenizer gives 50257",
        ),
        (
            &["--data", "tokens:"][..],
            "expected synthetic, text:PATH or tokens:PATTERN",
        ),
    ] {
        let error = flags(out.path(), extra).validate().unwrap_err().to_string();
        assert!(error.contains(says), "{extra:?}: {error}");
        assert!(!error.contains('\n'), "{error}");
    }
}
