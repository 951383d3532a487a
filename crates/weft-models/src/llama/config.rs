//! Llama-family configurations: the presets (`llama-tiny` for the CPU and tests; the shapes of
//! `smollm-135m`, `llama-3.2-1b` and `phi-3-mini`), `transformers`' defaults, the shape's
//! checks and derived sizes. Hugging Face `config.json` files: [`super::hf_config`].

use crate::error::{ModelError, Result};

/// The preset names [`LlamaConfig::from_name`] knows.
pub const LLAMA_NAMES: [&str; 4] = ["llama-tiny", "smollm-135m", "llama-3.2-1b", "phi-3-mini"];

/// Which Hugging Face class the weights are named after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM`: separate `q_proj`, `k_proj`, `v_proj`, `gate_proj`, `up_proj`.
    Llama,
    /// `Phi3ForCausalLM`: fused `qkv_proj` and `gate_up_proj`.
    Phi3,
}

/// Llama 3's frequency-dependent stretch of the rotary frequencies (`rope_type: "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

/// The shape of a Llama-family decoder and its initialisation seed.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub name: String,
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// The SwiGLU MLP's inner width.
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Grouped-query attention: query head h reads key/value head h ÷ (heads ÷ kv heads).
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<Llama3Scaling>,
    /// The head reuses the token table (`lm_head` absent from the weights).
    pub tie_word_embeddings: bool,
    /// Standard deviation of the initial weights (`initializer_range`).
    pub init_std: f64,
    pub seed: u64,
}

impl LlamaConfig {
    /// The preset called `name`; see [`LLAMA_NAMES`].
    pub fn from_name(name: &str) -> Result<Self> {
        let llama = Self::defaults(name, Architecture::Llama);
        let config = match name {
            "llama-tiny" => Self {
                vocab_size: 256,
                hidden_size: 64,
                intermediate_size: 176,
                num_hidden_layers: 2,
                num_attention_heads: 4,
                num_key_value_heads: 2,
                head_dim: 16,
                max_position_embeddings: 128,
                rms_norm_eps: 1e-5,
                tie_word_embeddings: true,
                ..llama
            },
            "smollm-135m" => Self {
                vocab_size: 49152,
                hidden_size: 576,
                intermediate_size: 1536,
                num_hidden_layers: 30,
                num_attention_heads: 9,
                num_key_value_heads: 3,
                head_dim: 64,
                max_position_embeddings: 2048,
                rms_norm_eps: 1e-5,
                tie_word_embeddings: true,
                ..llama
            },
            "llama-3.2-1b" => Self {
                vocab_size: 128_256,
                hidden_size: 2048,
                intermediate_size: 8192,
                num_hidden_layers: 16,
                num_attention_heads: 32,
                num_key_value_heads: 8,
                head_dim: 64,
                max_position_embeddings: 131_072,
                rms_norm_eps: 1e-5,
                rope_theta: 500_000.0,
                rope_scaling: Some(Llama3Scaling {
                    factor: 32.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 8192,
                }),
                tie_word_embeddings: true,
                ..llama
            },
            "phi-3-mini" => Self::defaults(name, Architecture::Phi3),
            _ => {
                return Err(ModelError::UnknownModel {
                    name: name.into(),
                    known: LLAMA_NAMES.join(", "),
                })
            }
        };
        config.validate()?;
        Ok(config)
    }

    /// `transformers`' defaults for `architecture` (`LlamaConfig()`, `Phi3Config()`), named
    /// `name`.
    pub(super) fn defaults(name: &str, architecture: Architecture) -> Self {
        let (vocab_size, hidden_size, intermediate_size, max_positions, rms_norm_eps) =
            match architecture {
                Architecture::Llama => (32_000, 4096, 11_008, 2048, 1e-6),
                Architecture::Phi3 => (32_064, 3072, 8192, 4096, 1e-5),
            };
        Self {
            name: name.into(),
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: 32,
            head_dim: hidden_size / 32,
            max_position_embeddings: max_positions,
            rms_norm_eps,
            rope_theta: 10_000.0,
            rope_scaling: None,
            tie_word_embeddings: false,
            init_std: 0.02,
            seed: 0,
        }
    }

    /// Checks the shape: every size positive, the query heads a multiple of the key/value
    /// heads, RoPE over an even head width.
    pub fn validate(&self) -> Result<()> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if let Some((key, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(ModelError::Config(format!("{}: {key} is 0", self.name)));
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(ModelError::Config(format!(
                "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.name, self.num_attention_heads, self.num_key_value_heads
            )));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(ModelError::Config(format!(
                "{}: head_dim {} is odd (RoPE rotates pairs)",
                self.name, self.head_dim
            )));
        }
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !(positive(self.rms_norm_eps) && positive(self.rope_theta) && positive(self.init_std)) {
            return Err(ModelError::Config(format!(
                "{}: rms_norm_eps, rope_theta and initializer_range must be positive",
                self.name
            )));
        }
        Ok(())
    }

    /// Query heads sharing each key/value head.
    pub fn group_size(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// Parameters of the whole model (the head counted once when tied).
    pub fn num_parameters(&self) -> usize {
        let (d, h) = (self.hidden_size, self.head_dim);
        let attention = d * h * (self.num_attention_heads * 2 + self.num_key_value_heads * 2);
        let mlp = 3 * d * self.intermediate_size;
        let layer = attention + mlp + 2 * d;
        let table = self.vocab_size * d;
        let head = if self.tie_word_embeddings { 0 } else { table };
        table + self.num_hidden_layers * layer + d + head
    }

    /// Blocks of the model: the embeddings, each layer's attention and MLP halves, the head.
    pub fn num_blocks(&self) -> usize {
        2 * self.num_hidden_layers + 2
    }

    /// Trainable values of each block (a pipeline's balance): the token table, each layer's
    /// attention half (its RMSNorm, q, k, v and o) and MLP half (its RMSNorm, gate, up and
    /// down), and the head's RMSNorm plus the matrix it multiplies by (the table when tied:
    /// the work of the logits either way).
    pub fn block_parameter_counts(&self) -> Vec<u64> {
        let (d, h) = (self.hidden_size, self.head_dim);
        let table = (self.vocab_size * d) as u64;
        let attention = d * h * (2 * self.num_attention_heads + 2 * self.num_key_value_heads) + d;
        let mlp = 3 * d * self.intermediate_size + d;
        let mut counts = vec![table];
        for _ in 0..self.num_hidden_layers {
            counts.extend([attention as u64, mlp as u64]);
        }
        counts.push(table + d as u64);
        counts
    }

    /// With the initialisation seed `seed`.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
}
