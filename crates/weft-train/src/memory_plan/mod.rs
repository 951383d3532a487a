//! The memory planner behind `cargo xtask memory-plan`: per-rank memory of a training run by
//! category, predicted from the model's shape and the run's settings before any GPU is
//! touched, each row with the formula that gave it. The model states follow weft's own
//! choices (where a master copy exists, which dtype the gradients accumulate in, what each
//! ZeRO stage shards), and the ZeRO paper's and DeepSpeed's published formulas are printed
//! beside them where they differ. The trainer's measured model-state bytes
//! (`weft_parallel::Trainer::model_state_bytes`) are tested against these rows.

mod activations;
mod model_states;
mod report;
mod runtime;

use anyhow::{bail, Result};
use weft_precision::PrecisionPolicy;

use crate::flags::Recompute;

pub use report::MemoryPlan;

/// Bytes.
pub type Bytes = u64;

/// Where the run trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda,
}

/// Which optimizer, for its state buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlannedOptimizer {
    /// SGD with momentum: one buffer (none without momentum).
    Sgd { momentum: bool },
    /// AdamW: two moments.
    AdamW,
}

impl PlannedOptimizer {
    fn state_buffers(self) -> usize {
        match self {
            PlannedOptimizer::Sgd { momentum } => usize::from(momentum),
            PlannedOptimizer::AdamW => 2,
        }
    }

    fn state_names(self) -> &'static str {
        match self {
            PlannedOptimizer::Sgd { momentum: true } => "momentum",
            PlannedOptimizer::Sgd { momentum: false } => "no state",
            PlannedOptimizer::AdamW => "two moments",
        }
    }
}

/// The model, as the planner sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelShape {
    /// A decoder-only transformer: the activation formula applies.
    Transformer {
        params: u64,
        layers: u64,
        hidden: u64,
        heads: u64,
        seq_len: u64,
        vocab: u64,
    },
    /// A Llama-family decoder (grouped-query attention, a SwiGLU MLP, tied or untied head): its
    /// exact parameter count and the tensors weft's layers keep for backward.
    Llama {
        name: String,
        params: u64,
        layers: u64,
        hidden: u64,
        heads: u64,
        kv_heads: u64,
        head_dim: u64,
        /// The SwiGLU MLP's inner width.
        ffn: u64,
        seq_len: u64,
        vocab: u64,
    },
    /// A built-in model whose parameters were counted and one sample's activations measured.
    Measured {
        name: String,
        params: u64,
        /// Parameters of the largest block (DeepSpeed's ZeRO-3 estimate uses it).
        largest_block: u64,
        /// Bytes one sample's forward pass keeps for backward, in fp32.
        activation_bytes_per_sample: u64,
    },
}

impl ModelShape {
    /// A transformer of `layers` layers of width `hidden`: 12·L·h² + V·h parameters unless
    /// `params` gives the count.
    pub fn transformer(
        params: Option<u64>,
        (layers, hidden, heads): (u64, u64, u64),
        (seq_len, vocab): (u64, u64),
    ) -> Result<Self> {
        if layers == 0 || hidden == 0 || heads == 0 || seq_len == 0 {
            bail!("--layers, --hidden, --heads and --seq-len must all be at least 1");
        }
        if hidden % heads != 0 {
            bail!("--hidden {hidden} is not divisible by --heads {heads}");
        }
        let params = params.unwrap_or(12 * layers * hidden * hidden + vocab * hidden);
        Ok(ModelShape::Transformer {
            params,
            layers,
            hidden,
            heads,
            seq_len,
            vocab,
        })
    }

    /// The Llama-family model `config` describes, trained on sequences of `seq_len` tokens.
    pub fn llama(config: &weft_models::llama::LlamaConfig, seq_len: u64) -> Result<Self> {
        if seq_len == 0 {
            bail!("--seq-len must be at least 1");
        }
        let count = |n: usize| n as u64;
        Ok(ModelShape::Llama {
            name: config.name.clone(),
            params: count(config.num_parameters()),
            layers: count(config.num_hidden_layers),
            hidden: count(config.hidden_size),
            heads: count(config.num_attention_heads),
            kv_heads: count(config.num_key_value_heads),
            head_dim: count(config.head_dim),
            ffn: count(config.intermediate_size),
            seq_len,
            vocab: count(config.vocab_size),
        })
    }

    /// Ψ, the parameters.
    pub fn params(&self) -> u64 {
        match self {
            ModelShape::Transformer { params, .. }
            | ModelShape::Llama { params, .. }
            | ModelShape::Measured { params, .. } => *params,
        }
    }

    /// Parameters of the largest layer: the token embedding or one MLP matrix (4h², or h times
    /// a SwiGLU's inner width) of a transformer, the largest block of a measured model.
    pub fn largest_layer(&self) -> u64 {
        match self {
            ModelShape::Transformer { hidden, vocab, .. } => {
                (vocab * hidden).max(4 * hidden * hidden)
            }
            ModelShape::Llama {
                hidden, vocab, ffn, ..
            } => (vocab * hidden).max(ffn * hidden),
            ModelShape::Measured { largest_block, .. } => *largest_block,
        }
    }
}

/// The run being planned.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanSettings {
    pub device: Device,
    /// Data-parallel ranks.
    pub world: usize,
    pub zero: u8,
    pub offload_optimizer: bool,
    pub tp: usize,
    pub pp: usize,
    pub precision: PrecisionPolicy,
    pub optimizer: PlannedOptimizer,
    /// Samples per rank (per micro-batch).
    pub batch_size: usize,
    /// What the backward recomputes (the plan keeps the recomputed blocks' inputs only).
    pub checkpoint_activations: Recompute,
    /// The gradients' dtype where it differs from weft's (e.g. fp16, as the ZeRO paper counts).
    pub grad_dtype: Option<candle_core::DType>,
    /// The optimizer states' dtype where it differs from the precision preset's.
    pub state_dtype: Option<candle_core::DType>,
    /// The gradient buckets' cap in MiB (`--bucket-cap-mb`; DDP's 25): ZeRO-2 and -3 stage
    /// gradients in buckets of this size.
    pub bucket_cap_mb: f64,
}

impl PlanSettings {
    fn check(&self) -> Result<()> {
        if self.world == 0 || self.tp == 0 || self.pp == 0 || self.batch_size == 0 {
            bail!("--world, --tp, --pp and --batch-size must all be at least 1");
        }
        if !(self.bucket_cap_mb > 0.0 && self.bucket_cap_mb.is_finite()) {
            bail!("--bucket-cap-mb {} must be positive", self.bucket_cap_mb);
        }
        if self.zero > 3 {
            bail!("--zero {}: stages are 0, 1, 2 and 3", self.zero);
        }
        if self.offload_optimizer && self.device == Device::Cpu {
            bail!("--offload-optimizer: the model is on the CPU already (offload is for GPUs)");
        }
        Ok(())
    }
}

/// One category of memory on one rank.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub category: &'static str,
    pub bytes: Bytes,
    /// How the figure was computed.
    pub formula: String,
    /// In host memory rather than on the device (offloaded).
    pub on_host: bool,
}

impl Row {
    fn new(category: &'static str, bytes: Bytes, formula: String) -> Self {
        Self {
            category,
            bytes,
            formula,
            on_host: false,
        }
    }

    fn on_host(mut self) -> Self {
        self.on_host = true;
        self.formula.push_str(", in host memory");
        self
    }
}

/// Plans the per-rank memory of `model` trained with `settings`.
pub fn plan(model: &ModelShape, settings: &PlanSettings) -> Result<MemoryPlan> {
    settings.check()?;
    let mut rows = model_states::rows(settings, model.params());
    rows.extend(model_states::sharding_rows(
        settings,
        model.params(),
        model.largest_layer(),
    ));
    rows.push(activations::row(settings, model));
    rows.extend(runtime::rows(settings));
    Ok(MemoryPlan::new(model.clone(), settings.clone(), rows))
}

/// The four model-state rows alone (no activations), as `(category, bytes)`.
pub fn model_states(settings: &PlanSettings, params: u64) -> Result<Vec<(&'static str, Bytes)>> {
    settings.check()?;
    let rows = model_states::rows(settings, params);
    Ok(rows.into_iter().map(|r| (r.category, r.bytes)).collect())
}
