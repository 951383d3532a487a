//! The `--data` flag of the language-model trainer: the synthetic Markov task (training and
//! validation streams of one chain, drawn from the seed), a text file (its bytes, memory-mapped,
//! or its `--tokenizer` tokens; the last tenth validates) or pre-tokenized shards
//! (memory-mapped, the `val` ones validating), all as token windows.

use std::path::Path;

use anyhow::{bail, Context, Result};
use weft_data::token_shards::{map_shard, shard_paths};
use weft_data::{MarkovTokens, TokenStream, TokenWindows, Tokenizer};

use crate::flags::TokenSource;
use crate::gpt_args::GptArgs;
use crate::language_model::LanguageModel;

/// Training and validation windows.
pub struct TokenData {
    pub train: TokenWindows,
    pub val: TokenWindows,
    /// The synthetic task's best achievable loss (its entropy rate).
    pub loss_floor: Option<f64>,
}

/// The data `--data` names, cut into windows of `seq_len` tokens for `config`'s vocabulary.
pub fn open_data(args: &GptArgs, config: &LanguageModel, seq_len: usize) -> Result<TokenData> {
    let vocab = config.vocab_size();
    match args.data.source()? {
        TokenSource::Text(path) => {
            let tokens = match &args.data.tokenizer {
                // Memory-mapped, a byte a token: the two parts share the mapping.
                None => TokenStream::map_text_bytes(Path::new(path))?,
                Some(spec) => {
                    let tokenizer = Tokenizer::from_spec(spec)?;
                    let tokens = tokenizer.encode_file(Path::new(path))?;
                    TokenStream::from_tokens(tokens, vocab)
                        .with_context(|| format!("--data text:{path} tokenized by {spec}"))?
                }
            };
            let cut = tokens.len() - tokens.len() / 10;
            let (train, val) = tokens.split_at(cut);
            Ok(TokenData {
                train: TokenWindows::from_stream(train, seq_len, vocab)?,
                val: TokenWindows::from_stream(val, seq_len, vocab)?,
                loss_floor: None,
            })
        }
        TokenSource::Shards(pattern) => {
            let (train, val) = shard_paths(pattern)?;
            Ok(TokenData {
                train: shard_windows(&train, seq_len, vocab)?,
                val: shard_windows(&val, seq_len, vocab)?,
                loss_floor: None,
            })
        }
        TokenSource::Synthetic => {
            let chain = MarkovTokens::new(vocab, args.training.seed)?;
            let stream = |tokens: usize, salt: u64| {
                let generated = chain.generate(tokens, args.training.seed.wrapping_add(salt));
                TokenWindows::new(generated, seq_len, vocab)
            };
            Ok(TokenData {
                train: stream(args.data.synthetic_tokens, 1)?,
                val: stream(args.data.val_tokens, 2)?,
                loss_floor: Some(chain.entropy_rate()),
            })
        }
    }
}

/// The windows of the shards `paths`, one after another, each checked (header, length, tokens
/// below `vocab`) and long enough for a window, or an error naming it.
fn shard_windows(
    paths: &[std::path::PathBuf],
    seq_len: usize,
    vocab: usize,
) -> Result<TokenWindows> {
    let mut parts = Vec::with_capacity(paths.len());
    for path in paths {
        let stream = map_shard(path, vocab)?;
        if stream.len() <= seq_len {
            bail!(
                "{}: {} tokens do not fill one window of --seq-len {seq_len} + 1",
                path.display(),
                stream.len()
            );
        }
        parts.push(stream);
    }
    Ok(TokenWindows::from_streams(parts, seq_len, vocab)?)
}
