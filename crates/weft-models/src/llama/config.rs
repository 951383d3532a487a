//! Llama-family configurations: the presets (`llama-tiny` for the CPU and tests; the shapes of
//! `smollm-135m`, `llama-3.2-1b` and `phi-3-mini`) and any shape read from a Hugging Face
//! `config.json` ([`LlamaConfig::from_hf_json`]): keys weft does not use are ignored, missing
//! keys take `transformers`' defaults for the architecture, and both the transformers-4
//! spellings (`rope_theta`, `rope_scaling`) and the transformers-5 ones (`rope_parameters`) are
//! read.

use std::path::Path;

use serde_json::{Map, Value};

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
    fn defaults(name: &str, architecture: Architecture) -> Self {
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

    /// The shape a Hugging Face `config.json` (its text `text`, read from `path`) describes.
    /// The architecture comes from `architectures` or `model_type`; a value of the wrong type,
    /// an unsupported `rope_scaling` or an inconsistent shape is a one-line error naming the
    /// file and the key.
    pub fn from_hf_json(text: &str, path: &Path) -> Result<Self> {
        let fail = |what: String| ModelError::Config(format!("{}: {what}", path.display()));
        let value: Value =
            serde_json::from_str(text).map_err(|e| fail(format!("not JSON: {e}")))?;
        let Value::Object(json) = value else {
            return Err(fail("not a JSON object".into()));
        };
        let architecture = architecture(&json).map_err(fail)?;
        let name = path
            .parent()
            .and_then(Path::file_name)
            .map_or("hf-config".into(), |n| n.to_string_lossy().into_owned());
        let mut config = Self::defaults(&name, architecture);
        let keys = Keys(&json);
        config.vocab_size = keys.usize("vocab_size", config.vocab_size).map_err(fail)?;
        config.hidden_size = keys
            .usize("hidden_size", config.hidden_size)
            .map_err(fail)?;
        config.intermediate_size = keys
            .usize("intermediate_size", config.intermediate_size)
            .map_err(fail)?;
        config.num_hidden_layers = keys
            .usize("num_hidden_layers", config.num_hidden_layers)
            .map_err(fail)?;
        config.num_attention_heads = keys
            .usize("num_attention_heads", config.num_attention_heads)
            .map_err(fail)?;
        config.num_key_value_heads = keys
            .usize("num_key_value_heads", config.num_attention_heads)
            .map_err(fail)?;
        let heads = config.num_attention_heads.max(1);
        config.head_dim = keys
            .usize("head_dim", config.hidden_size / heads)
            .map_err(fail)?;
        config.max_position_embeddings = keys
            .usize("max_position_embeddings", config.max_position_embeddings)
            .map_err(fail)?;
        config.rms_norm_eps = keys
            .f64("rms_norm_eps", config.rms_norm_eps)
            .map_err(fail)?;
        config.tie_word_embeddings = keys
            .bool("tie_word_embeddings", config.tie_word_embeddings)
            .map_err(fail)?;
        config.init_std = keys
            .f64("initializer_range", config.init_std)
            .map_err(fail)?;
        let (theta, scaling) = rope(&json, config.rope_theta).map_err(fail)?;
        (config.rope_theta, config.rope_scaling) = (theta, scaling);
        config.validate().map_err(|e| fail(e.to_string()))?;
        Ok(config)
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

    /// With the initialisation seed `seed`.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
}

/// The architecture a `config.json` names: `architectures[0]`, else `model_type`.
fn architecture(json: &Map<String, Value>) -> std::result::Result<Architecture, String> {
    let named = json
        .get("architectures")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str);
    let kind = json.get("model_type").and_then(Value::as_str);
    match (named, kind) {
        (Some("LlamaForCausalLM"), _) | (None, Some("llama")) => Ok(Architecture::Llama),
        (Some("Phi3ForCausalLM"), _) | (None, Some("phi3")) => Ok(Architecture::Phi3),
        (Some(other), _) => Err(format!(
            "architectures: {other:?}; weft builds LlamaForCausalLM and Phi3ForCausalLM"
        )),
        (None, other) => Err(format!(
            "model_type: {other:?}; weft builds llama and phi3 (or name them in architectures)"
        )),
    }
}

/// The rotary base and Llama 3's scaling: transformers 5's `rope_parameters` if present, else
/// transformers 4's `rope_theta` and `rope_scaling`.
fn rope(
    json: &Map<String, Value>,
    default_theta: f64,
) -> std::result::Result<(f64, Option<Llama3Scaling>), String> {
    let (theta, scaling, prefix) = match json.get("rope_parameters") {
        Some(Value::Object(params)) => {
            let theta = Keys(params).f64("rope_theta", default_theta)?;
            (theta, Some(params), "rope_parameters.")
        }
        Some(Value::Null) | None => {
            let theta = Keys(json).f64("rope_theta", default_theta)?;
            let scaling = match json.get("rope_scaling") {
                Some(Value::Object(s)) => Some(s),
                Some(Value::Null) | None => None,
                Some(other) => return Err(format!("rope_scaling: {other} is not an object")),
            };
            (theta, scaling, "rope_scaling.")
        }
        Some(other) => return Err(format!("rope_parameters: {other} is not an object")),
    };
    let Some(scaling) = scaling else {
        return Ok((theta, None));
    };
    let kind = scaling
        .get("rope_type")
        .or_else(|| scaling.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    match kind {
        "default" => Ok((theta, None)),
        "llama3" => {
            let keys = Keys(scaling);
            let at = |e: String| format!("{prefix}{e}");
            Ok((
                theta,
                Some(Llama3Scaling {
                    factor: keys.required_f64("factor").map_err(at)?,
                    low_freq_factor: keys.required_f64("low_freq_factor").map_err(at)?,
                    high_freq_factor: keys.required_f64("high_freq_factor").map_err(at)?,
                    original_max_position_embeddings: keys
                        .required_usize("original_max_position_embeddings")
                        .map_err(at)?,
                }),
            ))
        }
        other => Err(format!(
            "{prefix}rope_type: {other:?}; weft reads \"default\" and \"llama3\""
        )),
    }
}

/// Typed reads of a JSON object's keys; a value of the wrong type is an error naming the key.
struct Keys<'a>(&'a Map<String, Value>);

impl Keys<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    fn usize(&self, key: &str, default: usize) -> std::result::Result<usize, String> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| format!("{key}: {v} is not a count")),
        }
    }

    fn f64(&self, key: &str, default: f64) -> std::result::Result<f64, String> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| format!("{key}: {v} is not a number")),
        }
    }

    fn bool(&self, key: &str, default: bool) -> std::result::Result<bool, String> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| format!("{key}: {v} is not true or false")),
        }
    }

    fn required_f64(&self, key: &str) -> std::result::Result<f64, String> {
        self.get(key)
            .ok_or_else(|| format!("{key}: missing"))
            .and_then(|_| self.f64(key, 0.0))
    }

    fn required_usize(&self, key: &str) -> std::result::Result<usize, String> {
        self.get(key)
            .ok_or_else(|| format!("{key}: missing"))
            .and_then(|_| self.usize(key, 0))
    }
}
