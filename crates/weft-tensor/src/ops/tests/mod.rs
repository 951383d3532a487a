//! Tests of the custom ops (CPU kernels) against hand-computed values, Candle's own ops and
//! autograd, and central finite differences in f64.

mod batch_norm;
mod channels_last;
mod conv2d;
mod half;
mod llama_ops;
mod max_pool;
mod multi_tensor;
mod relu;
mod running_average;
mod space_to_depth;
mod support;
mod unscale;
