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

/// The GPT.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Model")]
#[serde(rename_all = "kebab-case")]
pub struct GptFlags {
    /// gpt-tiny (about 225 k parameters, for the CPU) | gpt2 (124 M) | gpt2-medium (350 M) |
    /// gpt2-large (774 M), Hugging Face's GPT-2 shapes and names
    #[arg(long, default_value = "gpt-tiny")]
    pub model: String,
    /// Dropout of the embeddings, attention weights and residual branches while training; the
    /// masks derive from --seed, the step, the micro-batch and each element's place, so every
    /// layout (--tp, --pp, micro-batches) drops what one process drops. On a GPU, 16-bit
    /// attention with dropout takes the unfused path over the full scores (the fused cuDNN
    /// attention runs without dropout)
    #[arg(long, default_value_t = 0.0)]
    pub dropout: f64,
    /// Initialise from a Hugging Face GPT-2 safetensors file (e.g. the hub's model.safetensors)
    #[arg(long)]
    pub init_from: Option<PathBuf>,
}

/// The tokens a GPT trains and validates on.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Data")]
#[serde(rename_all = "kebab-case")]
pub struct TokenDataFlags {
    /// synthetic (a seeded Markov chain over the model's vocabulary, learnable to 1.1097 nats per
    /// token) | text:PATH (the file's bytes as tokens, vocabulary 256; the last tenth validates)
    #[arg(long, default_value = "synthetic")]
    pub data: String,
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

impl TokenDataFlags {
    /// Checks `--data`: synthetic, or text:PATH naming a file.
    pub fn validate(&self) -> Result<()> {
        match self.data.split_once(':') {
            None if self.data == "synthetic" => Ok(()),
            Some(("text", path)) if std::path::Path::new(path).is_file() => Ok(()),
            Some(("text", path)) => bail!("--data {}: {path} is not a file", self.data),
            _ => bail!("--data {}: expected synthetic or text:PATH", self.data),
        }
    }
}
