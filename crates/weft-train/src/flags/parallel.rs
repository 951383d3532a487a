//! The "Parallelism" section: the ranks and how the model and its states are split over them
//! (data, tensor and pipeline parallelism, ZeRO and its offload), DDP's settings, and how the
//! step is replayed (CUDA graph, launched ahead).

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use weft_parallel::pipeline::ScheduleKind;
use weft_parallel::{BufferBroadcast, DdpConfig};

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

/// The job's ranks and how the training is spread over them.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Parallelism")]
#[serde(rename_all = "kebab-case")]
pub struct ParallelFlags {
    /// Ranks (processes started through weft-run; shm on the CPU, one GPU each with NCCL on
    /// GPUs), dp x tp x pp of them; default --dp x --tp x --pp, or one per visible GPU with a
    /// bare `--device cuda`
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
    /// Pipeline-parallel degree: the model's blocks cut into N stages on different ranks,
    /// micro-batches in flight between them
    #[arg(long, default_value_t = 1)]
    pub pp: usize,
    /// The pipeline's schedule: gpipe (all forwards, then all backwards) | 1f1b (one forward,
    /// one backward: at most P - s micro-batches' activations held on stage s)
    #[arg(long, value_enum, default_value_t = PipelineSchedule::OneFOneB)]
    pub schedule: PipelineSchedule,
    /// Blocks per pipeline stage, e.g. 3,3 (default: balanced as --pp-balance says)
    #[arg(long, value_delimiter = ',')]
    pub pp_split: Option<Vec<usize>>,
    /// How the stages are balanced without --pp-split: params (parameter counts) | time (each
    /// block's forward and backward timed on this device, averaged over the ranks)
    #[arg(long, value_enum, default_value_t = PipelineBalance::Params)]
    pub pp_balance: PipelineBalance,
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
    /// SyncBatchNorm: normalise with the statistics of the global batch over all ranks
    #[arg(long, default_value_t = false)]
    pub sync_bn: bool,
    /// On GPUs, replay the training step from a CUDA graph after two warm-up steps (on one GPU
    /// and under data parallelism; a step that cannot be captured runs eagerly, saying why)
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub cuda_graph: bool,
    /// Launch each replayed step before reading the one before, so that the GPU goes from one
    /// replay to the next without waiting for the host; `false` reads every step before
    /// launching the next
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub launch_ahead: bool,
    /// DDP: every rank reads rank 0's buffers (BatchNorm running statistics), as under
    /// PyTorch's DistributedDataParallel by default; a model whose training forward only
    /// writes them has them broadcast before they are read (validation, the saved model)
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
}

impl ParallelFlags {
    /// The number of ranks: `--nproc`, or `--dp x --tp x --pp`, or one per visible GPU for a
    /// bare `--device cuda`, or `--tp x --pp`.
    pub fn ranks(&self, device: &str) -> usize {
        match (self.nproc, self.dp) {
            (Some(n), _) => n,
            (None, Some(dp)) => dp * self.tp * self.pp,
            (None, None) if device == "cuda" => crate::device::visible_gpus().max(1),
            (None, None) => self.tp * self.pp,
        }
    }

    /// The data-parallel degree: `--dp`, or what the ranks leave after `--tp x --pp`.
    pub fn data_parallel(&self, device: &str) -> usize {
        self.dp
            .unwrap_or(self.ranks(device) / (self.tp * self.pp).max(1))
    }

    /// Checks the values and the mesh (`--dp x --tp x --pp` against `--nproc`, `--pp-split`
    /// against `--pp`); the error is one line naming the flag.
    pub fn validate(&self, device: &str) -> Result<()> {
        let (tp, pp) = (self.tp, self.pp);
        if self.nproc == Some(0) {
            bail!("--nproc must be at least 1");
        }
        if tp == 0 || pp == 0 || self.dp == Some(0) {
            bail!("--dp, --tp and --pp must be at least 1");
        }
        let ranks = self.ranks(device);
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
        if self.bucket_cap_mb.is_nan() || self.bucket_cap_mb <= 0.0 {
            bail!("--bucket-cap-mb {} must be positive", self.bucket_cap_mb);
        }
        if self.last_bucket_cap_mb.is_nan() || self.last_bucket_cap_mb < 0.0 {
            bail!(
                "--last-bucket-cap-mb {} must be positive or 0",
                self.last_bucket_cap_mb
            );
        }
        if self.offload_optimizer && !device.starts_with("cuda") {
            bail!("--offload-optimizer: the model is on the CPU already (offload is for GPUs)");
        }
        if self.delayed_update_from.is_some() && !self.offload_optimizer {
            bail!("--delayed-update-from overlaps an offloaded step: it needs --offload-optimizer");
        }
        Ok(())
    }

    /// DDP's settings from the flags, the buffers broadcast as `buffers` says when
    /// `--broadcast-buffers` is on.
    pub fn ddp(&self, buffers: BufferBroadcast) -> DdpConfig {
        DdpConfig {
            bucket_cap_mb: self.bucket_cap_mb,
            last_bucket_cap_mb: self.last_bucket_cap_mb,
            step_during_last_bucket: self.step_during_last_bucket,
            broadcast_buffers: match self.broadcast_buffers {
                true => buffers,
                false => BufferBroadcast::Off,
            },
            find_unused_parameters: self.find_unused_parameters,
            grad_compression: self.grad_compression.to_ddp(),
            ..DdpConfig::default()
        }
    }
}
