//! The language models `train-gpt` trains — the GPT-2 family and the Llama family (Llama,
//! SmolLM, Phi-3) — behind one description that the trainer's parts ask for what differs
//! between them: the shape's sizes, the model's construction, Hugging Face import and export,
//! and the layouts each family's `parallelize` splits it into.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use candle_core::Tensor;
use candle_core::{DType, Device};
use weft_models::gpt::MODEL_NAMES;
use weft_models::gpt::{self, Dense, GptConfig, GptLayers};
use weft_models::llama::{self, LlamaConfig, LlamaSplit, LLAMA_NAMES};
use weft_tensor::{BlockModel, EntryId, ParamStore};

use crate::flags::GptFlags;
use crate::gpt_parallel::TensorParallelLayers;

/// The vocabulary the data need of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataVocab {
    /// The model's own (synthetic tokens, pre-tokenized shards: checked token by token).
    Model,
    /// A text file's bytes: 256 tokens.
    Bytes,
    /// A tokenizer's `n` tokens.
    Tokenizer(usize),
}

/// A model `train-gpt` builds.
#[derive(Debug, Clone)]
pub enum LanguageModel {
    Gpt(GptConfig),
    Llama(LlamaConfig),
}

impl LanguageModel {
    /// The model the flags name, initialised from `seed`: `--model-config`'s `config.json`, else
    /// the Hugging Face `config.json` of an `--init-from` folder when `--model` is not given
    /// (a GPT run folder's own `config.json` is weft's run configuration: skipped), else `--model`
    /// (default `gpt-tiny`). A fresh model takes the vocabulary `vocab` the data need (bytes'
    /// 256, a tokenizer's); weights from `--init-from` keep theirs, which must cover it.
    pub fn from_flags(flags: &GptFlags, seed: u64, vocab: DataVocab) -> Result<Self> {
        let shape_file = match (&flags.model, &flags.model_config, &flags.init_from) {
            (Some(name), Some(_), _) => {
                bail!("--model {name} and --model-config: give one of them")
            }
            (_, Some(path), _) => Some(path.clone()),
            (None, None, Some(dir)) if is_hf_config(&dir.join("config.json")) => {
                Some(dir.join("config.json"))
            }
            _ => None,
        };
        let model = match shape_file {
            Some(path) => Self::Llama(read_hf_config(&path)?),
            None => Self::preset(flags.model.as_deref().unwrap_or(MODEL_NAMES[0]))?,
        };
        let needed = match vocab {
            DataVocab::Model => None,
            DataVocab::Bytes => Some(256),
            DataVocab::Tokenizer(n) => Some(n),
        };
        if let (Some(path), Some(needed)) = (&flags.init_from, needed) {
            let has = model.vocab_size();
            let reads = match vocab {
                DataVocab::Bytes => {
                    "--data text: reads bytes (give --tokenizer for the model's tokens)"
                }
                _ => "--tokenizer gives",
            };
            if (vocab == DataVocab::Bytes && has != needed) || has < needed {
                bail!(
                    "--init-from {}: the model's vocabulary has {has} tokens; {reads} {needed}",
                    path.display()
                );
            }
        }
        let fresh = needed.filter(|_| flags.init_from.is_none());
        let model = match model {
            Self::Gpt(config) => {
                let config = config.with_seed(seed).with_dropout(flags.dropout);
                match fresh {
                    Some(n) => Self::Gpt(config.with_vocab_size(n)),
                    None => Self::Gpt(config),
                }
            }
            Self::Llama(mut config) => {
                if flags.dropout != 0.0 {
                    bail!(
                        "--dropout {}: the Llama family trains without dropout (as Hugging Face's)",
                        flags.dropout
                    );
                }
                if let Some(n) = fresh {
                    config.vocab_size = n;
                }
                Self::Llama(config.with_seed(seed))
            }
        };
        Ok(model)
    }

    /// A preset by name: a GPT-2 shape or a Llama-family one.
    pub fn preset(name: &str) -> Result<Self> {
        if LLAMA_NAMES.contains(&name) {
            return Ok(Self::Llama(LlamaConfig::from_name(name)?));
        }
        match GptConfig::from_name(name) {
            Ok(config) => Ok(Self::Gpt(config)),
            Err(_) => bail!(
                "--model {name}: expected one of {}, {} (or --model-config PATH)",
                MODEL_NAMES.join(", "),
                LLAMA_NAMES.join(", ")
            ),
        }
    }

    /// The model's name (a preset's, or the folder of its `config.json`).
    pub fn name(&self) -> &str {
        match self {
            Self::Gpt(c) => &c.name,
            Self::Llama(c) => &c.name,
        }
    }

    pub fn vocab_size(&self) -> usize {
        match self {
            Self::Gpt(c) => c.vocab_size,
            Self::Llama(c) => c.vocab_size,
        }
    }

    /// The rows of the token table and the head's logits: the GPT's padded vocabulary, the
    /// Llama's own.
    pub fn vocab_rows(&self) -> usize {
        match self {
            Self::Gpt(c) => c.padded_vocab(),
            Self::Llama(c) => c.vocab_size,
        }
    }

    /// Trainable values (a tied head counted once).
    pub fn num_parameters(&self) -> usize {
        match self {
            Self::Gpt(c) => c.num_parameters(),
            Self::Llama(c) => c.num_parameters(),
        }
    }

    /// Training FLOPs per token at `seq_len`: `6 N + 12 L H d T` (PaLM's estimate, as nanoGPT's
    /// and llm.c's), N the parameters outside a position table (the tied head counted once;
    /// norms and biases, a fraction of a percent, included).
    pub fn flops_per_token(&self, seq_len: usize) -> f64 {
        let (params, layers, width) = match self {
            Self::Gpt(c) => (
                c.num_parameters() - c.context * c.n_embd,
                c.n_layer,
                c.n_embd,
            ),
            Self::Llama(c) => (
                c.num_parameters(),
                c.num_hidden_layers,
                c.num_attention_heads * c.head_dim,
            ),
        };
        6.0 * params as f64 + 12.0 * (layers * width * seq_len) as f64
    }

    /// The longest sequence the model takes.
    pub fn context(&self) -> usize {
        match self {
            Self::Gpt(c) => c.context,
            Self::Llama(c) => c.max_position_embeddings,
        }
    }

    /// Blocks: the embeddings, each layer's two halves, the head.
    pub fn num_blocks(&self) -> usize {
        match self {
            Self::Gpt(c) => c.num_blocks(),
            Self::Llama(c) => c.num_blocks(),
        }
    }

    /// Trainable values of each block (a pipeline's balance).
    pub fn block_parameter_counts(&self) -> Vec<u64> {
        match self {
            Self::Gpt(c) => c.block_parameter_counts(),
            Self::Llama(c) => c.block_parameter_counts(),
        }
    }

    /// Refuses, in one line, a tensor-parallel degree the model cannot be split into.
    pub fn check_layout(&self, tp: usize) -> Result<()> {
        match self {
            Self::Gpt(config) => crate::gpt_parallel::check_layout(config, tp),
            Self::Llama(config) => crate::llama_parallel::check_layout(config, tp),
        }
    }

    /// The token table a tied head multiplies by, which the first and last pipeline stage
    /// both hold: its name, or `None` for an untied head.
    pub fn tied_table(&self) -> Option<&'static str> {
        match self {
            Self::Gpt(_) => Some("transformer.wte.weight"),
            Self::Llama(c) => c.tie_word_embeddings.then_some("model.embed_tokens.weight"),
        }
    }

    /// The same model with one layer (a pipeline's measured balance times its blocks).
    pub fn one_layer(&self) -> Self {
        match self {
            Self::Gpt(c) => Self::Gpt(GptConfig {
                n_layer: 1,
                ..c.clone()
            }),
            Self::Llama(c) => Self::Llama(LlamaConfig {
                num_hidden_layers: 1,
                ..c.clone()
            }),
        }
    }

    /// The blocks `blocks` of the model in `dtype` on `device` (a pipeline stage's), whole or
    /// as this rank's parts of the tensor-parallel split `split`.
    pub fn build(
        &self,
        dtype: DType,
        device: &Device,
        split: Option<&Arc<TensorParallelLayers>>,
        blocks: Range<usize>,
    ) -> Result<BlockModel> {
        match self {
            Self::Gpt(config) => {
                let layers: &dyn GptLayers = match split {
                    Some(split) => split.as_ref(),
                    None => &Dense,
                };
                Ok(gpt::gpt_stage(config, dtype, device, layers, blocks)?)
            }
            Self::Llama(config) => {
                let split = split.map(|s| s.clone() as Arc<dyn LlamaSplit>);
                Ok(llama::llama_stage(config, dtype, device, blocks, split)?)
            }
        }
    }

    /// Loads Hugging Face weights at `path` (a file, or a folder holding `model.safetensors`;
    /// a Llama's also sharded) into `store`, the whole model.
    pub fn load_hf(&self, store: &ParamStore, path: &Path) -> Result<()> {
        match self {
            Self::Gpt(config) => Ok(gpt::hf::load_hf_safetensors(
                store,
                config,
                &weights_file(path),
            )?),
            Self::Llama(config) => Ok(llama::hf::load_hf(store, config, path)?),
        }
    }

    /// [`Self::load_hf`] into a store of this rank's parts: `part(id, full)` cuts entry `id`'s
    /// part from the full value.
    pub fn load_hf_sliced(
        &self,
        store: &ParamStore,
        path: &Path,
        part: impl Fn(EntryId, &Tensor) -> weft_tensor::Result<Tensor>,
    ) -> Result<()> {
        match self {
            Self::Gpt(config) => Ok(gpt::hf::load_hf_safetensors_sliced(
                store,
                config,
                &weights_file(path),
                |id, full| Ok(part(id, full)?),
            )?),
            Self::Llama(config) => Ok(llama::hf::load_hf_sliced(store, config, path, part)?),
        }
    }

    /// Writes `store` (the whole model) into the run folder `folder` as Hugging Face names it:
    /// a GPT's `model.safetensors`, a Llama's folder `hf/` (`config.json` and the weights).
    /// Returns the path written.
    pub fn export(&self, store: &ParamStore, folder: &Path) -> Result<PathBuf> {
        match self {
            Self::Gpt(config) => {
                let path = folder.join("model.safetensors");
                gpt::hf::save_hf_safetensors(store, config, &path)?;
                Ok(path)
            }
            Self::Llama(config) => {
                let dir = folder.join("hf");
                llama::hf::save_hf(store, config, &dir)?;
                Ok(dir)
            }
        }
    }
}

/// The weights' file of `path`: the file itself, or a folder's `model.safetensors`.
pub fn weights_file(path: &Path) -> PathBuf {
    match path.is_dir() {
        true => path.join(weft_tensor::hf_checkpoint::WEIGHTS),
        false => path.to_path_buf(),
    }
}

/// Whether `path` is a Hugging Face `config.json` (it names `model_type` or `architectures`),
/// not, say, the run configuration a weft run folder holds.
fn is_hf_config(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    let json: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    json.get("model_type").is_some() || json.get("architectures").is_some()
}

/// A Llama-family shape from a Hugging Face `config.json`.
fn read_hf_config(path: &Path) -> Result<LlamaConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--model-config {}", path.display()))?;
    Ok(LlamaConfig::from_hf_json(&text, path)?)
}
