//! Command-line flags of the GPT trainer (`cargo xtask train-gpt`), with validation that fails
//! before any work starts. Flags that mean the same as `train-resnet`'s have its names.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use weft_parallel::pipeline::{partition, ScheduleKind};

use crate::args::OptimizerKind;
use crate::logging::LogFlags;
use crate::optim_setup::OptimizerFlags;
use crate::run_checkpoints::CheckpointFlags;

/// The order of a pipeline's forwards and backwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
pub enum PipelineSchedule {
    #[value(name = "gpipe")]
    #[serde(rename = "gpipe")]
    GPipe,
    #[value(name = "1f1b")]
    #[serde(rename = "1f1b")]
    OneFOneB,
}

impl PipelineSchedule {
    pub fn kind(self) -> ScheduleKind {
        match self {
            PipelineSchedule::GPipe => ScheduleKind::GPipe,
            PipelineSchedule::OneFOneB => ScheduleKind::OneFOneB,
        }
    }
}

/// What the pipeline's stages are balanced by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PipelineBalance {
    Params,
    Time,
}

/// Flags of `cargo xtask train-gpt`.
#[derive(Debug, Clone, Args, Serialize)]
pub struct GptArgs {
    /// gpt-tiny (about 225 k parameters, for the CPU) | gpt2 (124 M) | gpt2-medium (350 M) |
    /// gpt2-large (774 M), Hugging Face's GPT-2 shapes and names
    #[arg(long, default_value = "gpt-tiny")]
    pub model: String,
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
    /// Global batch size, in sequences
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Passes over the training windows
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// Stop after this many optimizer steps in total (overrides epochs when smaller)
    #[arg(long)]
    pub steps: Option<usize>,
    /// Peak learning rate (reached after the warm-up)
    #[arg(long, default_value_t = 3e-3)]
    pub lr: f64,
    /// SGD momentum (with --optimizer sgd)
    #[arg(long, default_value_t = 0.9)]
    pub momentum: f64,
    /// Weight decay on every parameter (AdamW's decoupled decay, SGD's L2 term)
    #[arg(long, default_value_t = 0.1)]
    pub weight_decay: f64,
    /// sgd | adamw, with PyTorch's update rules
    #[arg(long, value_enum, default_value_t = OptimizerKind::Adamw)]
    pub optimizer: OptimizerKind,
    /// constant | step | cosine
    #[arg(long, default_value = "cosine")]
    pub lr_schedule: String,
    /// Steps of linear warm-up (default: a twentieth of the run's steps); fewer than the steps
    #[arg(long)]
    pub warmup_steps: Option<usize>,
    /// Seed of the initialisation and of the synthetic data
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// cpu | cuda | cuda:N
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// On a GPU, repeat exactly: cuDNN convolutions are chosen by its heuristics among the
    /// algorithms it marks deterministic (PyTorch's use_deterministic_algorithms); 16-bit
    /// convolutions may be slower. CPU runs repeat exactly without it
    #[arg(long, default_value_t = false)]
    pub deterministic: bool,
    /// fp32 | bf16-mixed | fp16-mixed, as train-resnet's (16-bit working copy and matmuls;
    /// attention, LayerNorm, GELU and the loss computed in f32 inside)
    #[arg(long, default_value = "fp32")]
    pub precision: String,
    /// Ranks (processes started through weft-run; shm on the CPU, NCCL on GPUs), dp x tp x pp
    /// of them; default --dp x --tp x --pp, or one per visible GPU with a bare `--device cuda`
    #[arg(long)]
    pub nproc: Option<usize>,
    /// Data-parallel degree: replicas of the model (each a pipeline of tensor-parallel
    /// groups) training on their own slices of the batch; default nproc / (tp x pp)
    #[arg(long)]
    pub dp: Option<usize>,
    /// Tensor-parallel degree: each layer's weights split over groups of N consecutive ranks
    /// (Megatron: attention by heads, the MLP by features, the vocabulary by rows)
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// Pipeline-parallel degree: the model's blocks (embeddings, layers, head) cut into N
    /// stages on different ranks, micro-batches in flight between them
    #[arg(long, default_value_t = 1)]
    pub pp: usize,
    /// The pipeline's schedule: gpipe (all forwards, then all backwards) | 1f1b (one forward,
    /// one backward: at most P - s micro-batches' activations held on stage s)
    #[arg(long, value_enum, default_value_t = PipelineSchedule::OneFOneB)]
    pub schedule: PipelineSchedule,
    /// Blocks per pipeline stage, e.g. 3,3 (default: balanced as --pp-balance says)
    #[arg(long, value_delimiter = ',')]
    pub pp_split: Option<Vec<usize>>,
    /// How the stages are balanced without --pp-split: params (parameter counts; the head
    /// counts its copy of the token table) | time (each block's forward and backward timed on
    /// this device, one layer standing for all, averaged over the ranks)
    #[arg(long, value_enum, default_value_t = PipelineBalance::Params)]
    pub pp_balance: PipelineBalance,
    /// ZeRO stage over the data-parallel ranks: 0 (DDP), 1 (optimizer states sharded), 2
    /// (gradients sharded too: each bucket reduced into its owners), 3 (parameters sharded
    /// too: each block's gathered before its forward and backward, released after)
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub zero: u8,
    /// Clip the gradients to this global norm before each step; logs `grad_norm`
    #[arg(long)]
    pub clip_grad_norm: Option<f64>,
    /// Under fp16-mixed, end the run when more than this many steps in a row are skipped for
    /// inf/NaN gradients (each halves the loss scale); without loss scaling a non-finite loss
    /// ends the run at once
    #[arg(long, default_value_t = 20)]
    pub max_skipped_steps: usize,
    /// Split each rank's batch into M micro-batches accumulated before one optimizer step
    /// (with --pp, the micro-batches in flight through the pipeline)
    #[arg(long, default_value_t = 1)]
    pub micro_batches: usize,
    /// Recompute each block's forward during backward instead of storing its activations (the
    /// same masks when dropping: they derive from the seed, not from a generator's state)
    #[arg(long, default_value_t = false)]
    pub checkpoint_activations: bool,
    /// Dropout of the embeddings, attention weights and residual branches while training; the
    /// masks derive from --seed, the step, the micro-batch and each element's place, so every
    /// layout (--tp, --pp, micro-batches) drops what one process drops
    #[arg(long, default_value_t = 0.0)]
    pub dropout: f64,
    /// Initialise from a Hugging Face GPT-2 safetensors file (e.g. the hub's model.safetensors)
    #[arg(long)]
    pub init_from: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    pub checkpoints: CheckpointFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub log: LogFlags,
    /// Root of the run folders; the run is written to OUT/NAME
    #[arg(long, default_value = "runs")]
    pub out: PathBuf,
    /// Name of the run folder (default: model-data-timestamp)
    #[arg(long)]
    pub name: Option<String>,
    /// No progress bar (logs one line per epoch only)
    #[arg(long, default_value_t = false)]
    pub quiet: bool,
}

impl GptArgs {
    /// Checks `--dp`, `--tp`, `--pp`, `--pp-split` and `--nproc` against each other and the
    /// model's blocks.
    fn validate_mesh(&self, config: &weft_models::GptConfig) -> Result<()> {
        let (tp, pp, ranks) = (self.tp, self.pp, self.ranks());
        if tp == 0 || pp == 0 || self.dp == Some(0) {
            bail!("--dp, --tp and --pp must be at least 1");
        }
        if pp > config.num_blocks() {
            bail!(
                "--pp {pp} exceeds the {} blocks of {} (embeddings, {} layers of two halves, head)",
                config.num_blocks(),
                self.model,
                config.n_layer
            );
        }
        if !ranks.is_multiple_of(tp * pp) {
            bail!("--tp {tp} x --pp {pp} must divide the {ranks} ranks (--nproc)");
        }
        if let Some(dp) = self.dp.filter(|dp| dp * tp * pp != ranks) {
            bail!(
                "--dp {dp} x --tp {tp} x --pp {pp} = {} ranks, but --nproc is {ranks}",
                dp * tp * pp
            );
        }
        if let Some(counts) = self.pp_split.as_ref().filter(|c| c.len() != pp) {
            bail!(
                "--pp-split {counts:?} has {} stages, --pp is {pp}",
                counts.len()
            );
        }
        self.stage_blocks(None)?;
        Ok(())
    }

    /// The number of ranks: `--nproc`, or `--dp x --tp x --pp`, or one per visible GPU for a
    /// bare `--device cuda`, or `--tp x --pp`.
    pub fn ranks(&self) -> usize {
        match (self.nproc, self.dp) {
            (Some(n), _) => n,
            (None, Some(dp)) => dp * self.tp * self.pp,
            (None, None) if self.device == "cuda" => crate::device::visible_gpus().max(1),
            (None, None) => self.tp * self.pp,
        }
    }

    /// The data-parallel degree: `--dp`, or what the ranks leave after `--tp x --pp`.
    pub fn data_parallel(&self) -> usize {
        self.dp.unwrap_or(self.ranks() / (self.tp * self.pp).max(1))
    }

    /// The model's blocks each pipeline stage runs: `--pp-split`, or balanced by `weights`
    /// (one per block; the parameter counts without them).
    pub fn stage_blocks(&self, weights: Option<&[u64]>) -> Result<Vec<std::ops::Range<usize>>> {
        let config = self.model_config()?;
        let counts = config.block_parameter_counts();
        let cuts = match &self.pp_split {
            Some(split) => partition::given(split, config.num_blocks()),
            None => partition::balanced(weights.unwrap_or(&counts), self.pp),
        };
        cuts.map_err(|e| anyhow::anyhow!("--pp-split: {e}"))
    }

    /// The optimizer and schedule flags for a run of `total_steps`.
    pub fn optimizer_flags(&self, total_steps: usize) -> OptimizerFlags<'_> {
        OptimizerFlags {
            optimizer: self.optimizer,
            lr: self.lr,
            momentum: self.momentum,
            weight_decay: self.weight_decay,
            offload_optimizer: false,
            delayed_update_from: None,
            lr_schedule: &self.lr_schedule,
            warmup_steps: self.warmup_steps.unwrap_or(total_steps / 20),
        }
    }

    /// The model's configuration for these flags (vocabulary 256 for text data).
    pub fn model_config(&self) -> Result<weft_models::GptConfig> {
        let mut config = weft_models::GptConfig::from_name(&self.model)
            .map_err(|e| anyhow::anyhow!("--model: {e}"))?
            .with_seed(self.seed)
            .with_dropout(self.dropout);
        if self.data.starts_with("text:") {
            config = config.with_vocab_size(256);
        }
        Ok(config)
    }

    /// Tokens per sequence: `--seq-len` or the model's context.
    pub fn seq_len(&self) -> Result<usize> {
        let context = self.model_config()?.context;
        Ok(self.seq_len.unwrap_or(context))
    }

    /// Checks every flag; the message of the error is one line naming the flag.
    pub fn validate(&self) -> Result<()> {
        let config = self.model_config()?;
        if self.batch_size == 0 {
            bail!("--batch-size must be at least 1");
        }
        self.checkpoints.validate(self.init_from.is_some())?;
        if self.nproc == Some(0) {
            bail!("--nproc must be at least 1");
        }
        self.validate_mesh(&config)?;
        crate::gpt_parallel::check_layout(&config, self.tp)?;
        let replicas = self.data_parallel();
        let per_rank = self.batch_size / replicas;
        if !self.batch_size.is_multiple_of(replicas) {
            bail!(
                "--batch-size {} is not divisible by the {replicas} data-parallel replicas (--dp)",
                self.batch_size
            );
        }
        if self.micro_batches == 0 || !per_rank.is_multiple_of(self.micro_batches) {
            bail!(
                "--micro-batches {} must divide the per-rank batch of {per_rank}",
                self.micro_batches
            );
        }
        match self.seq_len {
            Some(0) => bail!("--seq-len must be at least 1"),
            Some(n) if n > config.context => bail!(
                "--seq-len {n} exceeds the context of {} ({})",
                config.context,
                self.model
            ),
            _ => {}
        }
        if self.epochs == 0 && self.steps.is_none() {
            bail!("--epochs must be at least 1");
        }
        if self.steps == Some(0) {
            bail!("--steps must be at least 1");
        }
        self.optimizer_flags(0).validate()?;
        if self.pp > 1 && self.zero >= 2 {
            // ZeRO-2 and -3 keep only their shard of the token table's gradient, which the
            // first and last stage must sum whole.
            bail!(
                "--zero {} is not supported with --pp {} yet (--zero 0 or 1)",
                self.zero,
                self.pp
            );
        }
        if !(0.0..1.0).contains(&self.dropout) {
            bail!("--dropout {} must be in [0, 1)", self.dropout);
        }
        if let Some(max) = self.clip_grad_norm {
            if !(max.is_finite() && max > 0.0) {
                bail!("--clip-grad-norm {max} must be a positive number");
            }
        }
        if let Some(path) = &self.init_from {
            if !path.is_file() {
                bail!("--init-from {}: no such file", path.display());
            }
        }
        match self.data.split_once(':') {
            None if self.data == "synthetic" => {}
            Some(("text", path)) if std::path::Path::new(path).is_file() => {}
            Some(("text", path)) => bail!("--data {}: {path} is not a file", self.data),
            _ => bail!("--data {}: expected synthetic or text:PATH", self.data),
        }
        let policy = weft_precision::PrecisionPolicy::from_name(&self.precision)
            .map_err(|e| anyhow::anyhow!("--precision: {e}"))?;
        if policy.master.is_none() && policy.param != candle_core::DType::F32 {
            bail!("--precision {}: not supported yet", self.precision);
        }
        crate::device::parse_device(&self.device)?;
        Ok(())
    }
}
