//! ResNet configurations: torchvision's ResNet-18/34/50/101/152 and the CIFAR ResNets of
//! He et al. (ResNet-20/32/44/56: three stages of 16/32/64 channels, BasicBlocks).

use crate::error::{ModelError, Result};

/// The residual block type of a ResNet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// Two 3x3 convolutions (ResNet-18/34 and the CIFAR ResNets).
    Basic,
    /// 1x1 → 3x3 (carrying the stride) → 1x1 with 4x expansion (ResNet-50/101/152).
    Bottleneck,
}

impl BlockKind {
    pub fn expansion(self) -> usize {
        match self {
            BlockKind::Basic => 1,
            BlockKind::Bottleneck => 4,
        }
    }
}

/// The input stem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stem {
    /// 7x7/2 convolution then 3x3/2 max-pool, for 224x224 images (torchvision).
    ImageNet,
    /// 3x3/1 convolution and no max-pool, for 32x32 images.
    Cifar,
}

/// Everything that defines a ResNet.
#[derive(Debug, Clone, PartialEq)]
pub struct ResNetConfig {
    pub block: BlockKind,
    /// Residual blocks per stage.
    pub layers: Vec<usize>,
    /// Output channels of the first convolution (64 in torchvision, 16 for CIFAR ResNets).
    pub stem_width: usize,
    /// Planes of each stage (before expansion).
    pub widths: Vec<usize>,
    pub stem: Stem,
    pub num_classes: usize,
    /// Start the last BatchNorm of each residual branch at zero (torchvision's
    /// `zero_init_residual`), so every block begins as the identity.
    pub zero_init_residual: bool,
    /// Seed of the parameter initialisation.
    pub seed: u64,
    /// Run the blocks on channels-last tensors (PyTorch's `channels_last`): the stem converts
    /// its input once and every block keeps the layout, so a GPU's cuDNN convolutions run in
    /// NHWC without transposes. Values are those of the NCHW network.
    pub channels_last: bool,
}

/// Model names accepted by [`ResNetConfig::from_name`].
pub const MODEL_NAMES: &[&str] = &[
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
    "resnet20",
    "resnet32",
    "resnet44",
    "resnet56",
];

impl ResNetConfig {
    /// A torchvision ResNet (ImageNet stem) or a CIFAR ResNet (`resnet20` … `resnet56`).
    pub fn from_name(name: &str, num_classes: usize) -> Result<Self> {
        let torchvision = |block, layers: &[usize]| Self {
            block,
            layers: layers.to_vec(),
            stem_width: 64,
            widths: vec![64, 128, 256, 512],
            stem: Stem::ImageNet,
            num_classes,
            zero_init_residual: false,
            seed: 0,
            channels_last: false,
        };
        let cifar = |n: usize| Self {
            block: BlockKind::Basic,
            layers: vec![n; 3],
            stem_width: 16,
            widths: vec![16, 32, 64],
            stem: Stem::Cifar,
            num_classes,
            zero_init_residual: false,
            seed: 0,
            channels_last: false,
        };
        let config = match name {
            "resnet18" => torchvision(BlockKind::Basic, &[2, 2, 2, 2]),
            "resnet34" => torchvision(BlockKind::Basic, &[3, 4, 6, 3]),
            "resnet50" => torchvision(BlockKind::Bottleneck, &[3, 4, 6, 3]),
            "resnet101" => torchvision(BlockKind::Bottleneck, &[3, 4, 23, 3]),
            "resnet152" => torchvision(BlockKind::Bottleneck, &[3, 8, 36, 3]),
            "resnet20" => cifar(3),
            "resnet32" => cifar(5),
            "resnet44" => cifar(7),
            "resnet56" => cifar(9),
            _ => {
                return Err(ModelError::UnknownModel {
                    name: name.into(),
                    known: MODEL_NAMES.join(", "),
                })
            }
        };
        if num_classes == 0 {
            return Err(ModelError::Config("num_classes must be at least 1".into()));
        }
        Ok(config)
    }

    /// The same network with the CIFAR stem (3x3 conv, no max-pool) for 32x32 inputs.
    pub fn with_cifar_stem(mut self) -> Self {
        self.stem = Stem::Cifar;
        self
    }

    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    pub fn with_channels_last(mut self, on: bool) -> Self {
        self.channels_last = on;
        self
    }

    pub fn with_zero_init_residual(mut self, on: bool) -> Self {
        self.zero_init_residual = on;
        self
    }
}
