//! weft-models: models for weft, free of any parallelism.
//!
//! - [`mod@resnet`]: torchvision's ResNet-18/34/50/101/152 (with torchvision's parameter names,
//!   order and initialisation) and the CIFAR ResNet-20/32/44/56, built as
//!   [`weft_tensor::BlockModel`]s (stem, residual blocks, head).
//! - [`mod@gpt`]: a decoder-only transformer with GPT-2's architecture, Hugging Face's
//!   parameter names and initialisation, presets from `gpt-tiny` to `gpt2-large`.
//! - [`mod@llama`]: the Llama family (Llama 3, SmolLM, Phi-3) with Hugging Face's names:
//!   presets and `config.json` shapes, the model and its pipeline stages, checkpoints in and
//!   out.
//! - [`layers`]: Conv2d, BatchNorm2d (PyTorch semantics), Linear, Conv1D, LayerNorm.
//! - [`loss`]: cross-entropy, top-1 accuracy and next-token cross-entropy.

pub mod error;
pub mod gpt;
pub mod layers;
pub mod llama;
pub mod loss;
pub mod resnet;
mod stages;
#[cfg(test)]
mod test_support;

pub use error::{ModelError, Result};
pub use gpt::{gpt, GptConfig};
pub use resnet::{resnet, ResNetConfig};
