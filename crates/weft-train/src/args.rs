//! Command-line flags of the ResNet trainer, with validation that fails before any work starts.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::logging::LogFlags;
use crate::run_checkpoints::CheckpointFlags;

/// Which optimizer to train with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    Sgd,
    Adamw,
}

/// How DDP's gradient buckets travel between ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// In fp32.
    None,
    /// As bf16 copies, the average written back in fp32 (PyTorch's bf16_compress_hook).
    Bf16,
    /// As fp16 copies (PyTorch's fp16_compress_hook).
    Fp16,
}

impl Compression {
    pub fn to_ddp(self) -> weft_parallel::GradCompression {
        match self {
            Compression::None => weft_parallel::GradCompression::None,
            Compression::Bf16 => weft_parallel::GradCompression::Bf16,
            Compression::Fp16 => weft_parallel::GradCompression::Fp16,
        }
    }
}

/// Whether the ResNet's blocks run on channels-last tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelsLast {
    /// On a GPU (where weft's NHWC kernels and cuDNN's NHWC convolutions are faster:
    /// BENCHMARKS.md), NCHW otherwise.
    Auto,
    /// Always (on the CPU the kernels compute NCHW inside).
    True,
    /// Never.
    False,
}

impl ChannelsLast {
    /// The choice for a run on `device`.
    pub fn resolve(self, device: &candle_core::Device) -> bool {
        match self {
            ChannelsLast::Auto => device.is_cuda(),
            ChannelsLast::True => true,
            ChannelsLast::False => false,
        }
    }
}

/// `--conv-stats`: when 16-bit channels-last convolutions on a GPU sum their output for the
/// batch norm after them in the same cuDNN kernel ([`weft_tensor::ops::ConvStats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConvStatsFlag {
    /// Never.
    Off,
    /// Per shape, where timed faster than the convolution and the batch norm's own pass.
    WhereFaster,
    /// Wherever cuDNN has an engine for it.
    Always,
}

impl From<ConvStatsFlag> for weft_tensor::ops::ConvStats {
    fn from(flag: ConvStatsFlag) -> Self {
        match flag {
            ConvStatsFlag::Off => Self::Off,
            ConvStatsFlag::WhereFaster => Self::WhereFaster,
            ConvStatsFlag::Always => Self::Always,
        }
    }
}

/// Data augmentation preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Augment {
    /// Random crop + horizontal flip (CIFAR-style) or RandomResizedCrop + flip (ImageNet-style).
    Default,
    /// Only conversion to floats and normalisation.
    None,
}

/// Flags of `cargo xtask train-resnet`.
#[derive(Debug, Clone, Args, Serialize)]
pub struct TrainArgs {
    /// resnet18 … resnet152 (torchvision), resnet20/32/44/56 (CIFAR ResNets)
    #[arg(long, default_value = "resnet20")]
    pub model: String,
    /// Use the CIFAR stem (3x3 conv, no max-pool) for a torchvision ResNet; CIFAR ResNets always have it.
    #[arg(long, default_value_t = false)]
    pub cifar_stem: bool,
    /// Run the blocks on channels-last tensors (PyTorch's `channels_last`): on a GPU cuDNN's
    /// NHWC convolutions and weft's NHWC kernels, without transposes. `auto`: on a GPU;
    /// `--channels-last` alone means `true`
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub channels_last: ChannelsLast,
    /// synthetic | cifar10:PATH | imagefolder:PATH (a folder with train/ and val/ inside)
    #[arg(long, default_value = "synthetic")]
    pub data: String,
    /// Number of classes of the model's head, at least the data set's (the default); synthetic
    /// data has min(N, 10) classes
    #[arg(long)]
    pub num_classes: Option<usize>,
    /// Side of the (square) training images
    #[arg(long, default_value_t = 32)]
    pub image_size: usize,
    /// Training samples of the synthetic data set
    #[arg(long, default_value_t = 8_192)]
    pub synthetic_train: usize,
    /// Validation samples of the synthetic data set
    #[arg(long, default_value_t = 2_000)]
    pub synthetic_val: usize,
    /// Global batch size
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    #[arg(long, default_value_t = 2)]
    pub epochs: usize,
    /// Stop after this many optimizer steps in total (overrides epochs when smaller)
    #[arg(long)]
    pub steps: Option<usize>,
    #[arg(long, default_value_t = 0.1)]
    pub lr: f64,
    #[arg(long, default_value_t = 0.9)]
    pub momentum: f64,
    #[arg(long, default_value_t = 5e-4)]
    pub weight_decay: f64,
    #[arg(long, value_enum, default_value_t = OptimizerKind::Sgd)]
    pub optimizer: OptimizerKind,
    /// constant | step | cosine
    #[arg(long, default_value = "cosine")]
    pub lr_schedule: String,
    #[arg(long, default_value_t = 0)]
    pub warmup_steps: usize,
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
    /// On a GPU, when a 16-bit channels-last convolution sums its output for the batch norm
    /// after it in the same cuDNN kernel: where-faster (each shape timed once against the
    /// convolution and the batch norm's own pass over its output; on an H100 fp16 gains,
    /// bf16 has no fast engine), always, or off. The variance then comes from f32 sums of x
    /// and x² (E[x²] − E[x]²), less precise than the batch norm's own pass for data whose mean
    /// is far larger than its spread: off keeps the batch norm's pass. Deciding times cuDNN's
    /// candidates once per shape at start (about 2 s for ResNet-50's shapes); where-faster
    /// leaves out engines cuDNN compiles at run time (about half a second each), always waits
    /// for them
    #[arg(long, value_enum, default_value_t = ConvStatsFlag::WhereFaster)]
    pub conv_stats: ConvStatsFlag,
    /// fp32 (everything in fp32) | bf16-mixed (bf16 working copy of the weights, activations
    /// and gradients; fp32 master weights, gradient accumulation and optimizer states) |
    /// fp16-mixed (the same in fp16, with dynamic loss scaling). On the CPU each op computes in
    /// f32 inside; on a GPU cuDNN's 16-bit tensor-core convolutions and weft's 16-bit kernels
    /// (batch norm with fp32 statistics). bf16-true (no master copy) is not supported yet
    #[arg(long, default_value = "fp32")]
    pub precision: String,
    /// Data-parallel ranks (processes started through weft-run; shm backend on the CPU, one
    /// GPU each with NCCL on GPUs); default 1, or one per visible GPU with `--device cuda`
    #[arg(long)]
    pub nproc: Option<usize>,
    /// SyncBatchNorm: normalise with the statistics of the global batch over all ranks
    #[arg(long, default_value_t = false)]
    pub sync_bn: bool,
    /// On one GPU, replay the training step from a CUDA graph after two warm-up steps
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub cuda_graph: bool,
    /// Launch each replayed step before reading the one before, so that the GPU goes from one
    /// replay to the next without waiting for the host; `false` reads every step before
    /// launching the next
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub launch_ahead: bool,
    /// ZeRO stage over the data-parallel ranks: 0 (plain DDP), 1 (optimizer states sharded:
    /// each rank steps its 1/N of the flat buffers and all-gathers the parameters), 2 (also
    /// each gradient bucket reduced into the ranks that own its parts), 3 (also the parameters
    /// sharded: each block's gathered before its forward and backward, released after)
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub zero: u8,
    /// ZeRO-Offload: keep the fp32 master weights and optimizer states in host memory and run
    /// the optimizer step on the CPU (multi-threaded), copying the gradients over and the
    /// parameters back each step; exact unless --delayed-update-from is given. GPU only
    #[arg(long, default_value_t = false)]
    pub offload_optimizer: bool,
    /// With --offload-optimizer: from this step on, overlap the CPU's optimizer step with the
    /// next step's forward and backward (DeepSpeed's delayed parameter update). This changes
    /// the math: each update uses gradients one step stale. The steps before update exactly
    #[arg(long, value_name = "STEP")]
    pub delayed_update_from: Option<u64>,
    /// DDP: every rank reads rank 0's buffers (BatchNorm running statistics), as under
    /// PyTorch's DistributedDataParallel by default. ResNet's training forward only writes
    /// them, so they are broadcast before they are read (validation, the saved model), not
    /// before every forward: the same values, one collective fewer a step
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub broadcast_buffers: bool,
    /// DDP bucket size in MiB
    #[arg(long, default_value_t = 25.0)]
    pub bucket_cap_mb: f64,
    /// DDP: the last bucket (the first layers, whose gradients come last) in MiB, so that
    /// little communication is left once backward ends; 0 leaves it to the reverse walk, as
    /// PyTorch does
    #[arg(long, default_value_t = 0.0)]
    pub last_bucket_cap_mb: f64,
    /// DDP: the optimizer steps every other bucket's parameters while the last bucket's
    /// all-reduce runs, then that bucket's (without a loss scaler or gradient clipping, which
    /// read every gradient first); the same values either way
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub step_during_last_bucket: bool,
    /// DDP: reduce gradient buckets as 16-bit copies and write the average back
    #[arg(long, value_enum, default_value_t = Compression::None)]
    pub grad_compression: Compression,
    /// A parameter that receives no gradient in a step is reduced as zero instead of ending
    /// the run (PyTorch DDP's find_unused_parameters)
    #[arg(long, default_value_t = false)]
    pub find_unused_parameters: bool,
    /// Clip the gradients to this global norm before each optimizer step
    /// (torch.nn.utils.clip_grad_norm_; the norm over all ranks); logs `grad_norm` per step
    #[arg(long)]
    pub clip_grad_norm: Option<f64>,
    /// Under fp16-mixed, end the run when more than this many steps in a row are skipped for
    /// inf/NaN gradients (each halves the loss scale); without loss scaling a non-finite loss
    /// ends the run at once
    #[arg(long, default_value_t = 20)]
    pub max_skipped_steps: usize,
    /// Split each rank's batch into M micro-batches whose gradients accumulate before one
    /// optimizer step (only the last one communicates); the step runs eagerly (no CUDA graph)
    #[arg(long, default_value_t = 1)]
    pub micro_batches: usize,
    /// Initialise from a safetensors file with torchvision parameter names
    #[arg(long)]
    pub init_from: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    pub checkpoints: CheckpointFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub log: LogFlags,
    #[arg(long, value_enum, default_value_t = Augment::Default)]
    pub augment: Augment,
    /// Shuffle the training set each epoch
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub shuffle: bool,
    /// Recompute each block's forward during backward instead of storing its activations
    #[arg(long, default_value_t = false)]
    pub checkpoint_activations: bool,
    /// Background threads decoding and augmenting images per rank (default: on GPUs the
    /// host's cores shared among its ranks, one left to each rank, 1 to 8; 1 on the CPU,
    /// whose cores the ranks compute on)
    #[arg(long)]
    pub workers: Option<usize>,
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

impl TrainArgs {
    /// The optimizer and schedule flags.
    pub fn optimizer_flags(&self) -> crate::optim_setup::OptimizerFlags<'_> {
        crate::optim_setup::OptimizerFlags {
            optimizer: self.optimizer,
            lr: self.lr,
            momentum: self.momentum,
            weight_decay: self.weight_decay,
            offload_optimizer: self.offload_optimizer,
            delayed_update_from: self.delayed_update_from,
            lr_schedule: &self.lr_schedule,
            warmup_steps: self.warmup_steps,
        }
    }

    /// The number of ranks: `--nproc`, or one per visible GPU for a bare `--device cuda`
    /// without it, or 1.
    pub fn ranks(&self) -> usize {
        match self.nproc {
            Some(n) => n,
            None if self.device == "cuda" => crate::device::visible_gpus().max(1),
            None => 1,
        }
    }

    /// Checks every flag; the message of the error is one line naming the flag.
    pub fn validate(&self) -> Result<()> {
        if !weft_models::resnet::MODEL_NAMES.contains(&self.model.as_str()) {
            bail!(
                "--model {}: unknown model; expected one of {}",
                self.model,
                weft_models::resnet::MODEL_NAMES.join(", ")
            );
        }
        if self.batch_size == 0 {
            bail!("--batch-size must be at least 1");
        }
        self.checkpoints.validate(self.init_from.is_some())?;
        if self.nproc == Some(0) {
            bail!("--nproc must be at least 1");
        }
        if !self.batch_size.is_multiple_of(self.ranks()) {
            bail!(
                "--batch-size {} is not divisible by the {} ranks (--nproc)",
                self.batch_size,
                self.ranks()
            );
        }
        if let Some(max) = self.clip_grad_norm {
            if !(max.is_finite() && max > 0.0) {
                bail!("--clip-grad-norm {max} must be a positive number");
            }
        }
        if self.micro_batches == 0 {
            bail!("--micro-batches must be at least 1");
        }
        let per_rank = self.batch_size / self.ranks();
        if !per_rank.is_multiple_of(self.micro_batches) {
            bail!(
                "--micro-batches {} does not divide the per-rank batch of {per_rank} (--batch-size {} over {} ranks)",
                self.micro_batches,
                self.batch_size,
                self.ranks()
            );
        }
        if self.bucket_cap_mb.is_nan() || self.bucket_cap_mb <= 0.0 {
            bail!("--bucket-cap-mb {} must be positive", self.bucket_cap_mb);
        }
        if self.last_bucket_cap_mb.is_nan() || self.last_bucket_cap_mb < 0.0 {
            bail!(
                "--last-bucket-cap-mb {} must be positive or 0",
                self.last_bucket_cap_mb
            );
        }
        if self.epochs == 0 && self.steps.is_none() {
            bail!("--epochs must be at least 1");
        }
        if self.steps == Some(0) {
            bail!("--steps must be at least 1");
        }
        if self.image_size < 8 {
            bail!("--image-size {} is too small (at least 8)", self.image_size);
        }
        self.optimizer_flags().validate()?;
        if self.num_classes == Some(0) {
            bail!("--num-classes must be at least 1");
        }
        if let Some(path) = &self.init_from {
            if !path.is_file() {
                bail!("--init-from {}: no such file", path.display());
            }
        }
        let policy = weft_precision::PrecisionPolicy::from_name(&self.precision)
            .map_err(|e| anyhow::anyhow!("--precision: {e}"))?;
        if policy.master.is_none() && policy.param != candle_core::DType::F32 {
            bail!(
                "--precision {}: not supported yet (the optimizers step fp32 or fp64 master weights)",
                self.precision
            );
        }
        crate::data::DataSpec::parse(&self.data)?;
        crate::device::parse_device(&self.device)?;
        Ok(())
    }
}
