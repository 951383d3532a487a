//! Layers with PyTorch parameter names and initialisation, built on weft-tensor's parameter
//! store and CPU kernels.

mod batch_norm;
mod conv;
mod init;
mod linear;

pub use batch_norm::BatchNorm2d;
pub use conv::Conv2d;
pub use init::Init;
pub use linear::Linear;
