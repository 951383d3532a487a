//! weft-models: models for weft, free of any parallelism.
//!
//! - [`mod@resnet`]: torchvision's ResNet-18/34/50/101/152 (with torchvision's parameter names,
//!   order and initialisation) and the CIFAR ResNet-20/32/44/56, built as
//!   [`weft_tensor::BlockModel`]s (stem, residual blocks, head).
//! - [`layers`]: Conv2d, BatchNorm2d (PyTorch semantics), Linear.
//! - [`loss`]: cross-entropy and top-1 accuracy.

pub mod error;
pub mod layers;
pub mod loss;
pub mod resnet;

pub use error::{ModelError, Result};
pub use resnet::{resnet, ResNetConfig};
