//! `weft tokenize` (and `cargo xtask tokenize`): text files to pre-tokenized shards in llm.c's
//! format (`weft_data::token_shards`), ready for `train-gpt --data tokens:DIR/NAME_*.bin`. The
//! files are tokenized whole, one after another, into one token sequence; its first
//! `--val-tokens` tokens go to `DIR/NAME_val_000000.bin`, the rest to `NAME_train_000001.bin`,
//! `NAME_train_000002.bin`, … of `--shard-tokens` tokens each (the last one shorter).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use weft_data::token_shards::write_shard;
use weft_data::Tokenizer;

#[derive(Debug, Args)]
pub struct TokenizeArgs {
    /// gpt2 (GPT-2's BPE, built in) or the path of a Hugging Face tokenizer.json
    #[arg(long)]
    tokenizer: String,
    /// UTF-8 text files, tokenized in this order
    #[arg(long, num_args = 1.., required = true)]
    input: Vec<PathBuf>,
    /// The folder the shards are written to (created if missing)
    #[arg(long)]
    out: PathBuf,
    /// The shards' name prefix
    #[arg(long, default_value = "tokens")]
    name: String,
    /// Tokens of the validation shard (default: a tenth of the input)
    #[arg(long)]
    val_tokens: Option<usize>,
    /// Tokens per training shard
    #[arg(long, default_value_t = 100_000_000)]
    shard_tokens: usize,
}

/// Tokenizes the inputs and writes the shards; prints one line per shard.
pub fn run(args: &TokenizeArgs) -> Result<()> {
    if args.shard_tokens == 0 {
        bail!("--shard-tokens must be at least 1");
    }
    let tokenizer = Tokenizer::from_spec(&args.tokenizer)
        .with_context(|| format!("--tokenizer {}", args.tokenizer))?;
    let mut tokens = Vec::new();
    for path in &args.input {
        tokens.extend(tokenizer.encode_file(path)?);
    }
    let val = args.val_tokens.unwrap_or(tokens.len() / 10);
    if val == 0 || val >= tokens.len() {
        bail!(
            "--val-tokens {val}: the inputs hold {} tokens; the validation shard needs at least \
             one and the training shards the rest",
            tokens.len()
        );
    }
    std::fs::create_dir_all(&args.out).with_context(|| format!("--out {}", args.out.display()))?;
    let vocab = tokenizer.vocab_size();
    let (val_part, train_part) = tokens.split_at(val);
    let shards = std::iter::once(("val", 0, val_part)).chain(
        train_part
            .chunks(args.shard_tokens)
            .enumerate()
            .map(|(i, chunk)| ("train", i + 1, chunk)),
    );
    for (kind, index, part) in shards {
        let path = args
            .out
            .join(format!("{}_{kind}_{index:06}.bin", args.name));
        write_shard(&path, part, vocab)?;
        println!("{}: {} tokens", path.display(), part.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_data::token_shards::{map_shard, shard_paths};

    #[test]
    fn text_becomes_a_validation_shard_then_training_shards() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("a.txt");
        std::fs::write(
            &input,
            "The quick brown fox jumps over the lazy dog. ".repeat(30),
        )
        .unwrap();
        let out = dir.path().join("shards");
        let args = TokenizeArgs {
            tokenizer: "gpt2".into(),
            input: vec![input.clone()],
            out: out.clone(),
            name: "fox".into(),
            val_tokens: Some(40),
            shard_tokens: 100,
        };
        run(&args).unwrap();
        let (train, val) = shard_paths(&format!("{}/fox_*.bin", out.display())).unwrap();
        assert_eq!(val, [out.join("fox_val_000000.bin")]);
        let all = Tokenizer::from_spec("gpt2")
            .unwrap()
            .encode_file(&input)
            .unwrap();
        assert_eq!(train.len(), (all.len() - 40).div_ceil(100));
        let mut read = map_shard(&val[0], 50_257).unwrap().to_vec();
        for path in &train {
            read.extend(map_shard(path, 50_257).unwrap().to_vec());
        }
        assert_eq!(read, all);
        let too_many = TokenizeArgs {
            val_tokens: Some(all.len()),
            ..args
        };
        assert!(run(&too_many)
            .unwrap_err()
            .to_string()
            .contains("--val-tokens"));
    }
}
