//! The image-classification task's sections, "Model" and "Data", and its defaults for the
//! shared ones.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde::Serialize;

use super::TaskDefaults;

/// `train-resnet`'s defaults.
#[derive(Debug, Clone, Copy)]
pub struct ResnetDefaults;

impl TaskDefaults for ResnetDefaults {
    type Model = ResnetFlags;
    type Data = ImageDataFlags;
    const BATCH_SIZE: &'static str = "64";
    const EPOCHS: &'static str = "2";
    const OPTIMIZER: &'static str = "sgd";
    const LR: &'static str = "0.1";
    const WEIGHT_DECAY: &'static str = "5e-4";
    fn warmup_steps(_total_steps: usize) -> usize {
        0
    }
}

/// Whether the ResNet's blocks run on channels-last tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelsLast {
    /// On a GPU (where weft's NHWC kernels and cuDNN's NHWC convolutions are faster:
    /// docs/history/2026-11.md), NCHW otherwise.
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

/// The ResNet and how its kernels run.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Model")]
#[serde(rename_all = "kebab-case")]
pub struct ResnetFlags {
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
    /// Number of classes of the model's head, at least the data set's (the default); synthetic
    /// data has min(N, 10) classes
    #[arg(long)]
    pub num_classes: Option<usize>,
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
    /// Initialise from a safetensors file with torchvision parameter names
    #[arg(long)]
    pub init_from: Option<PathBuf>,
}

/// The images a ResNet trains and validates on, and how they are prepared.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Data")]
#[serde(rename_all = "kebab-case")]
pub struct ImageDataFlags {
    /// synthetic | cifar10:PATH | imagefolder:PATH (a folder with train/ and val/ inside)
    #[arg(long, default_value = "synthetic")]
    pub data: String,
    /// Side of the (square) training images
    #[arg(long, default_value_t = 32)]
    pub image_size: usize,
    /// Training samples of the synthetic data set
    #[arg(long, default_value_t = 8_192)]
    pub synthetic_train: usize,
    /// Validation samples of the synthetic data set
    #[arg(long, default_value_t = 2_000)]
    pub synthetic_val: usize,
    #[arg(long, value_enum, default_value_t = Augment::Default)]
    pub augment: Augment,
    /// Shuffle the training set each epoch
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub shuffle: bool,
    /// An undecodable or oversized image is replaced by the next good sample of the data set
    /// (batch shapes stay fixed) and counted in the epoch line, instead of ending the run
    #[arg(long, default_value_t = false)]
    pub skip_bad_samples: bool,
    /// Background threads decoding and augmenting images per rank (default: on GPUs the
    /// host's cores shared among its ranks, one left to each rank, 1 to 8; 1 on the CPU,
    /// whose cores the ranks compute on)
    #[arg(long)]
    pub workers: Option<usize>,
}
