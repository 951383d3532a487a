//! GPT configurations: the presets (`gpt-tiny` for the CPU, Hugging Face's `gpt2`,
//! `gpt2-medium`, `gpt2-large`) and their derived sizes.

use crate::error::{ModelError, Result};

/// The preset names [`GptConfig::from_name`] knows.
pub const MODEL_NAMES: [&str; 4] = ["gpt-tiny", "gpt2", "gpt2-medium", "gpt2-large"];

/// The shape of a decoder-only transformer (GPT-2's architecture) and its initialisation seed.
#[derive(Debug, Clone, PartialEq)]
pub struct GptConfig {
    pub name: String,
    /// Tokens the data can contain (GPT-2's BPE: 50257).
    pub vocab_size: usize,
    /// The embedding table's rows are padded to a multiple of this (64: tensor-core friendly
    /// shapes; the padded logits are masked out of the loss).
    pub vocab_multiple: usize,
    /// Longest sequence (rows of the position embedding), `n_positions` in Hugging Face.
    pub context: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    /// Dropout probability of the embeddings, attention weights and residual branches while
    /// training (GPT-2: 0.1; default 0).
    pub dropout: f64,
    pub layer_norm_eps: f64,
    /// Standard deviation of the initial weights (Hugging Face's `initializer_range`).
    pub init_std: f64,
    pub seed: u64,
}

impl GptConfig {
    /// The preset called `name`; see [`MODEL_NAMES`].
    pub fn from_name(name: &str) -> Result<Self> {
        let (vocab_size, context, n_embd, n_layer, n_head) = match name {
            "gpt-tiny" => (256, 128, 64, 4, 4),
            "gpt2" => (50257, 1024, 768, 12, 12),
            "gpt2-medium" => (50257, 1024, 1024, 24, 16),
            "gpt2-large" => (50257, 1024, 1280, 36, 20),
            _ => {
                return Err(ModelError::UnknownModel {
                    name: name.into(),
                    known: MODEL_NAMES.join(", "),
                })
            }
        };
        Ok(Self {
            name: name.into(),
            vocab_size,
            vocab_multiple: 64,
            context,
            n_embd,
            n_layer,
            n_head,
            dropout: 0.0,
            layer_norm_eps: 1e-5,
            init_std: 0.02,
            seed: 0,
        })
    }

    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    pub fn with_vocab_size(mut self, vocab_size: usize) -> Self {
        self.vocab_size = vocab_size;
        self
    }

    pub fn with_context(mut self, context: usize) -> Self {
        self.context = context;
        self
    }

    pub fn with_dropout(mut self, dropout: f64) -> Self {
        self.dropout = dropout;
        self
    }

    /// Rows of the embedding table: the vocabulary rounded up to a multiple of
    /// `vocab_multiple`.
    pub fn padded_vocab(&self) -> usize {
        self.vocab_size.div_ceil(self.vocab_multiple) * self.vocab_multiple
    }

    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }

    /// Blocks of the model: the embeddings, two per layer (attention, MLP), the head.
    pub fn num_blocks(&self) -> usize {
        2 * self.n_layer + 2
    }

    /// Trainable values of each block (a pipeline's balance): the embeddings' two tables, each
    /// layer's attention half (`ln_1`, `c_attn`, `c_proj`: 4C² + 6C) and MLP half (`ln_2`,
    /// `c_fc`, `c_proj`: 8C² + 7C), and the head's LayerNorm plus the token table it multiplies
    /// by (its copy on a last stage, and the work of the logits either way).
    pub fn block_parameter_counts(&self) -> Vec<u64> {
        let c = self.n_embd;
        let table = self.padded_vocab() * c;
        let mut counts = vec![(table + self.context * c) as u64];
        for _ in 0..self.n_layer {
            counts.extend([(4 * c * c + 6 * c) as u64, (8 * c * c + 7 * c) as u64]);
        }
        counts.push((table + 2 * c) as u64);
        counts
    }

    /// Trainable values, the tied head counted once: `V'C + TC + L(12C² + 13C) + 2C`.
    pub fn num_parameters(&self) -> usize {
        let c = self.n_embd;
        self.padded_vocab() * c + self.context * c + self.n_layer * (12 * c * c + 13 * c) + 2 * c
    }

    /// Checks the sizes; the error names the field.
    pub fn validate(&self) -> Result<()> {
        let fail = |message: String| Err(ModelError::Config(message));
        for (field, value) in [
            ("vocab_size", self.vocab_size),
            ("vocab_multiple", self.vocab_multiple),
            ("context", self.context),
            ("n_embd", self.n_embd),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
        ] {
            if value == 0 {
                return fail(format!("{}: {field} must be at least 1", self.name));
            }
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return fail(format!(
                "{}: n_embd {} is not divisible by n_head {}",
                self.name, self.n_embd, self.n_head
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return fail(format!(
                "{}: dropout {} must be in [0, 1)",
                self.name, self.dropout
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hugging Face's `GPT2LMHeadModel` counts (tied head once): 124,439,808 for `gpt2`,
    /// 354,823,168 for `gpt2-medium` and 774,030,080 for `gpt2-large`; ours add the padding
    /// rows, 47 (50304 − 50257) times the width.
    #[test]
    fn parameter_counts_match_hugging_face_plus_padding() {
        for (name, hf) in [
            ("gpt2", 124_439_808),
            ("gpt2-medium", 354_823_168),
            ("gpt2-large", 774_030_080),
        ] {
            let config = GptConfig::from_name(name).unwrap();
            assert_eq!(config.padded_vocab(), 50304);
            assert_eq!(config.num_parameters(), hf + 47 * config.n_embd, "{name}");
        }
    }

    #[test]
    fn bad_shapes_and_names_are_one_line_errors() {
        let mut config = GptConfig::from_name("gpt-tiny").unwrap();
        config.n_head = 3;
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("n_head 3"), "{err}");
        let err = GptConfig::from_name("gpt3").unwrap_err().to_string();
        assert!(err.contains("gpt3") && err.contains("gpt2-medium"), "{err}");
    }
}
