//! A Llama-family shape from a Hugging Face `config.json` ([`LlamaConfig::from_hf_json`]):
//! keys weft does not use are ignored, missing keys take `transformers`' defaults for the
//! architecture, and both the transformers-4 spellings (`rope_theta`, `rope_scaling`) and the
//! transformers-5 ones (`rope_parameters`) are read; and the `config.json` weft writes beside
//! an exported model ([`LlamaConfig::to_hf_json`]).

use std::path::Path;

use serde_json::{Map, Value};

use super::config::{Architecture, Llama3Scaling, LlamaConfig};
use crate::error::{ModelError, Result};

impl LlamaConfig {
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
        let parameters = match json.get("rope_parameters") {
            Some(Value::Object(params)) => Keys(params),
            _ => Keys(&json),
        };
        let partial = parameters.f64("partial_rotary_factor", 1.0).map_err(fail)?;
        if partial != 1.0 {
            return Err(fail(format!(
                "partial_rotary_factor: {partial}; weft rotates the whole head (1.0)"
            )));
        }
        (config.rope_theta, config.rope_scaling) = (theta, scaling);
        config.validate().map_err(|e| fail(e.to_string()))?;
        Ok(config)
    }

    /// The `config.json` that `transformers` builds this shape from, the weights stored as
    /// `dtype` (`"float32"`, `"bfloat16"`, …), in transformers 4's spelling (which transformers
    /// 5 reads too). No padding token: Phi-3's default id would lie outside a small vocabulary.
    pub fn to_hf_json(&self, dtype: &str) -> Value {
        let (class, kind) = match self.architecture {
            Architecture::Llama => ("LlamaForCausalLM", "llama"),
            Architecture::Phi3 => ("Phi3ForCausalLM", "phi3"),
        };
        let scaling = self.rope_scaling.map(|s| {
            serde_json::json!({
                "rope_type": "llama3",
                "factor": s.factor,
                "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position_embeddings,
            })
        });
        serde_json::json!({
            "architectures": [class],
            "model_type": kind,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "initializer_range": self.init_std,
            "hidden_act": "silu",
            "attention_bias": false,
            "mlp_bias": false,
            "attention_dropout": 0.0,
            "pad_token_id": null,
            "bos_token_id": null,
            "eos_token_id": null,
            "torch_dtype": dtype,
        })
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

    /// The value of `key` read by `read` (`what` it must be), `default` when absent or null.
    fn read<T>(
        &self,
        key: &str,
        default: T,
        (read, what): (fn(&Value) -> Option<T>, &str),
    ) -> std::result::Result<T, String> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => read(v).ok_or_else(|| format!("{key}: {v} is not {what}")),
        }
    }

    fn usize(&self, key: &str, default: usize) -> std::result::Result<usize, String> {
        let count = |v: &Value| v.as_u64().and_then(|n| usize::try_from(n).ok());
        self.read(key, default, (count, "a count"))
    }

    fn f64(&self, key: &str, default: f64) -> std::result::Result<f64, String> {
        self.read(key, default, (Value::as_f64, "a number"))
    }

    fn bool(&self, key: &str, default: bool) -> std::result::Result<bool, String> {
        self.read(key, default, (Value::as_bool, "true or false"))
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
