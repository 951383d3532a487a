//! The language-model task's sections, "Model" and "Data", and its defaults for the shared
//! ones.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use serde::Serialize;

use super::TaskDefaults;

/// `train-gpt`'s defaults.
#[derive(Debug, Clone, Copy)]
pub struct GptDefaults;

impl TaskDefaults for GptDefaults {
    type Model = GptFlags;
    type Data = TokenDataFlags;
    const BATCH_SIZE: &'static str = "32";
    const EPOCHS: &'static str = "1";
    const OPTIMIZER: &'static str = "adamw";
    const LR: &'static str = "3e-3";
    const WEIGHT_DECAY: &'static str = "0.1";
    fn warmup_steps(total_steps: usize) -> usize {
        total_steps / 20
    }
}

/// The language model.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Model")]
#[serde(rename_all = "kebab-case")]
pub struct GptFlags {
    /// gpt-tiny (the default; about 225 k parameters, for the CPU) | gpt2 (124 M) |
    /// gpt2-medium (350 M) | gpt2-large (774 M), Hugging Face's GPT-2 shapes and names; or the
    /// Llama family's llama-tiny (for the CPU) | smollm-135m | llama-3.2-1b | phi-3-mini
    #[arg(long)]
    pub model: Option<String>,
    /// A Hugging Face config.json giving a Llama-family shape (LlamaForCausalLM or
    /// Phi3ForCausalLM) instead of --model
    #[arg(long)]
    pub model_config: Option<PathBuf>,
    /// Dropout of the embeddings, attention weights and residual branches while training (the
    /// GPT's); the masks derive from --seed, the step, the micro-batch and each element's
    /// place, so every layout (--tp, --pp, micro-batches) drops what one process drops. On a
    /// GPU, 16-bit attention drops its weights inside cuDNN's fused attention with cuDNN's own
    /// masks (seeded from the same values): there it agrees with other layouts in
    /// distribution, not bit for bit (f32 and the CPU take the unfused path and stay exact)
    #[arg(long, default_value_t = 0.0)]
    pub dropout: f64,
    /// Initialise from Hugging Face safetensors: a file (e.g. the hub's model.safetensors), a
    /// folder holding model.safetensors (a GPT run folder), or a Llama-family model's folder
    /// (its config.json then gives the shape without --model; sharded weights are read through
    /// their index)
    #[arg(long)]
    pub init_from: Option<PathBuf>,
}

impl GptFlags {
    /// The model's name for logs and run names: `--model`, else the folder of
    /// `--model-config` or `--init-from`, else the default `gpt-tiny`.
    pub fn model_name(&self) -> String {
        let folder = |path: &std::path::Path| {
            let dir = if path.is_dir() {
                Some(path)
            } else {
                path.parent()
            };
            let name = dir.and_then(std::path::Path::file_name);
            name.map(|n| n.to_string_lossy().into_owned())
        };
        self.model
            .clone()
            .or_else(|| self.model_config.as_deref().and_then(folder))
            .or_else(|| {
                self.init_from
                    .as_deref()
                    .filter(|p| p.is_dir())
                    .and_then(folder)
            })
            .unwrap_or_else(|| weft_models::gpt::MODEL_NAMES[0].into())
    }
}

/// The tokens a language model trains and validates on.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Data")]
#[serde(rename_all = "kebab-case")]
pub struct TokenDataFlags {
    /// synthetic (a seeded Markov chain over the model's vocabulary, learnable to 1.1097 nats per
    /// token) | text:PATH (the file's bytes as tokens, vocabulary 256, or its --tokenizer
    /// tokens; the last tenth validates) | tokens:PATTERN (pre-tokenized shards in llm.c's
    /// format, memory-mapped; `*` in the file name matches any run; files named with `val`
    /// validate, the others train; written by `cargo xtask tokenize`)
    #[arg(long, default_value = "synthetic")]
    pub data: String,
    /// gpt2 (GPT-2's BPE, built in) | PATH of a Hugging Face tokenizer.json: --data text:PATH is
    /// tokenized with it (and a fresh model takes its vocabulary); bytes without it
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// Training tokens of the synthetic data
    #[arg(long, default_value_t = 1 << 20)]
    pub synthetic_tokens: usize,
    /// Validation tokens of the synthetic data
    #[arg(long, default_value_t = 1 << 16)]
    pub val_tokens: usize,
    /// Tokens per sequence (default: the model's context)
    #[arg(long)]
    pub seq_len: Option<usize>,
}

/// What `--data` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource<'a> {
    Synthetic,
    Text(&'a str),
    Shards(&'a str),
}

impl TokenDataFlags {
    /// `--data` parsed: synthetic, text:PATH naming a file or tokens:PATTERN; `--tokenizer`
    /// only with text.
    pub fn source(&self) -> Result<TokenSource<'_>> {
        let source = match self.data.split_once(':') {
            None if self.data == "synthetic" => TokenSource::Synthetic,
            Some(("text", path)) if std::path::Path::new(path).is_file() => TokenSource::Text(path),
            Some(("text", path)) => bail!("--data {}: {path} is not a file", self.data),
            Some(("tokens", pattern)) if !pattern.is_empty() => TokenSource::Shards(pattern),
            _ => bail!(
                "--data {}: expected synthetic, text:PATH or tokens:PATTERN",
                self.data
            ),
        };
        if let (Some(tokenizer), false) = (&self.tokenizer, matches!(source, TokenSource::Text(_)))
        {
            bail!(
                "--tokenizer {tokenizer}: tokenizes --data text:PATH, not --data {}",
                self.data
            );
        }
        Ok(source)
    }

    /// Checks `--data` and `--tokenizer`.
    pub fn validate(&self) -> Result<()> {
        self.source().map(|_| ())
    }
}
