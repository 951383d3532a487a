//! The `--data` flag of the GPT trainer: the synthetic Markov task (training and validation
//! streams of one chain, drawn from the seed) or a text file's bytes, memory-mapped (its last
//! tenth validates), both as token windows.

use anyhow::Result;
use weft_data::{MarkovTokens, TokenStream, TokenWindows};

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
    match args.data.data.strip_prefix("text:") {
        Some(path) => {
            // Memory-mapped, a byte a token: the two parts share the mapping.
            let tokens = TokenStream::map_text_bytes(std::path::Path::new(path))?;
            let cut = tokens.len() - tokens.len() / 10;
            let (train, val) = tokens.split_at(cut);
            Ok(TokenData {
                train: TokenWindows::from_stream(train, seq_len, vocab)?,
                val: TokenWindows::from_stream(val, seq_len, vocab)?,
                loss_floor: None,
            })
        }
        None => {
            let chain = MarkovTokens::new(vocab, args.training.seed)?;
            Ok(TokenData {
                train: TokenWindows::new(
                    chain.generate(
                        args.data.synthetic_tokens,
                        args.training.seed.wrapping_add(1),
                    ),
                    seq_len,
                    vocab,
                )?,
                val: TokenWindows::new(
                    chain.generate(args.data.val_tokens, args.training.seed.wrapping_add(2)),
                    seq_len,
                    vocab,
                )?,
                loss_floor: Some(chain.entropy_rate()),
            })
        }
    }
}
