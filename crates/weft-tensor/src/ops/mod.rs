//! Fast CPU kernels as Candle custom ops, for training convolutional networks on the CPU.
//!
//! - [`conv2d`]: im2col + GEMM convolution whose backward runs dedicated input-gradient
//!   (GEMM + col2im) and weight-gradient (GEMM over im2col) kernels.
//! - [`max_pool2d`]: max pooling with any kernel, stride and padding, with a backward that
//!   routes each output gradient to the first maximum of its window (as PyTorch does).
//! - [`batch_norm_train`]: training-mode 2-D batch normalisation with a fused analytic
//!   backward; also returns the batch statistics for the running averages.
//!
//! The CPU kernels handle f32 and f64; with the `cuda` feature, `batch_norm_train` on CUDA
//! f32/f64 tensors can run the fused kernels of `kernels/batch_norm.cu` (off by default until
//! checked on a GPU, see [`set_cuda_batch_norm_kernels`]); with the `cudnn` feature, `conv2d` on CUDA f32/f64
//! tensors runs cuDNN's forward, backward-data and backward-filter convolutions. Other
//! tensors are computed with Candle's own (differentiable) ops.

mod batch_norm;
mod batch_norm_cpu;
#[cfg(feature = "cuda")]
mod batch_norm_cuda;
mod conv2d;
mod conv_cpu;
#[cfg(feature = "cudnn")]
mod conv_cudnn;
mod im2col;
mod matmul;
mod max_pool;
mod max_pool_cpu;
mod scratch;
mod storage;

pub use batch_norm::{batch_norm_train, set_cuda_batch_norm_kernels};
pub use conv2d::conv2d;
#[cfg(feature = "cudnn")]
pub use conv_cudnn::set_allow_tf32;
pub use max_pool::max_pool2d;

#[cfg(test)]
mod tests;
