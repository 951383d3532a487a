//! Layers with PyTorch (and, for GPT, Hugging Face) parameter names and initialisation, built
//! on weft-tensor's parameter store and kernels.

mod batch_norm;
mod conv;
mod conv1d;
mod init;
mod layer_norm;
mod linear;

pub use batch_norm::BatchNorm2d;
pub use conv::Conv2d;
pub use conv1d::Conv1D;
pub use init::Init;
pub use layer_norm::{layer_norm, LayerNorm};
pub use linear::Linear;
