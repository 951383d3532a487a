//! The presets' shapes and parameter counts, and `config.json` files in both transformers
//! spellings, with their refusals.

use std::path::Path;

use super::*;

#[test]
fn presets_have_their_published_sizes() {
    // Parameter counts of the Hugging Face checkpoints (embeddings tied where they are).
    for (name, parameters) in [
        ("smollm-135m", 134_515_008),
        ("llama-3.2-1b", 1_235_814_400),
        ("phi-3-mini", 3_821_079_552),
    ] {
        let config = LlamaConfig::from_name(name).unwrap();
        assert_eq!(config.num_parameters(), parameters, "{name}");
    }
    let tiny = LlamaConfig::from_name("llama-tiny").unwrap();
    assert_eq!((tiny.group_size(), tiny.head_dim), (2, 16));
    assert!(LlamaConfig::from_name("llama-9").is_err());
}

#[test]
fn block_counts_add_up_to_the_parameters() {
    for name in LLAMA_NAMES {
        let config = LlamaConfig::from_name(name).unwrap();
        let counts = config.block_parameter_counts();
        assert_eq!(counts.len(), config.num_blocks());
        let table = (config.vocab_size * config.hidden_size) as u64;
        // The head's count holds the table once more (its copy, or its work when tied).
        let tied_copy = if config.tie_word_embeddings { table } else { 0 };
        let total: u64 = counts.iter().sum();
        assert_eq!(total - tied_copy, config.num_parameters() as u64, "{name}");
    }
}

fn read(text: &str) -> Result<LlamaConfig, String> {
    LlamaConfig::from_hf_json(text, Path::new("models/smol/config.json")).map_err(|e| e.to_string())
}

#[test]
fn a_transformers_4_config_reads_with_defaults_for_missing_keys() {
    let config = read(
        r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192,
            "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": true,
            "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "torch_dtype": "bfloat16", "bos_token_id": 128000, "use_cache": true}"#,
    )
    .unwrap();
    let preset = LlamaConfig::from_name("llama-3.2-1b").unwrap();
    assert_eq!(
        LlamaConfig {
            name: preset.name.clone(),
            ..config.clone()
        },
        preset
    );
    assert_eq!(config.name, "smol");
    // Nothing but the architecture: transformers' LlamaConfig() defaults.
    let bare = read(r#"{"model_type": "llama"}"#).unwrap();
    assert_eq!(
        (bare.hidden_size, bare.num_key_value_heads, bare.head_dim),
        (4096, 32, 128)
    );
    assert_eq!((bare.rms_norm_eps, bare.rope_theta), (1e-6, 10_000.0));
}

#[test]
fn a_transformers_5_config_reads_rope_parameters() {
    let config = read(
        r#"{"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9,
            "num_key_value_heads": 3, "intermediate_size": 1536, "num_hidden_layers": 30,
            "vocab_size": 49152, "dtype": "bfloat16",
            "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}}"#,
    )
    .unwrap();
    assert_eq!((config.rope_theta, config.rope_scaling), (100_000.0, None));
    assert_eq!(config.head_dim, 64);
    let phi = read(r#"{"architectures": ["Phi3ForCausalLM"]}"#).unwrap();
    assert_eq!(phi.architecture, Architecture::Phi3);
    assert_eq!(
        LlamaConfig {
            name: "phi-3-mini".into(),
            ..phi
        },
        LlamaConfig::from_name("phi-3-mini").unwrap()
    );
}

#[test]
fn bad_files_are_one_line_naming_the_file_and_the_key() {
    for (text, says) in [
        (r#"{"model_type": "gpt2"}"#, "model_type: Some(\"gpt2\")"),
        (
            r#"{"model_type": "llama", "hidden_size": "big"}"#,
            "hidden_size: \"big\" is not a count",
        ),
        (
            r#"{"model_type": "llama", "num_key_value_heads": 5}"#,
            "not a multiple of num_key_value_heads 5",
        ),
        (
            r#"{"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}"#,
            "rope_scaling.rope_type: \"yarn\"",
        ),
        (
            r#"{"model_type": "llama", "rope_parameters": {"rope_type": "llama3", "factor": 8.0}}"#,
            "rope_parameters.low_freq_factor: missing",
        ),
        (
            r#"{"model_type": "phi3", "rope_parameters": {"partial_rotary_factor": 0.5}}"#,
            "partial_rotary_factor: 0.5",
        ),
        ("[1, 2]", "not a JSON object"),
    ] {
        let err = read(text).unwrap_err();
        assert!(
            err.contains("models/smol/config.json: ") && err.contains(says),
            "{err}"
        );
        assert!(!err.contains('\n'), "{err}");
    }
}
