//! Training kernels as Candle custom ops (CPU, and CUDA with the `cuda` feature) for
//! convolutional networks.
//!
//! - [`conv2d`]: im2col + GEMM convolution whose backward runs dedicated input-gradient
//!   (GEMM + col2im) and weight-gradient (GEMM over im2col) kernels.
//! - [`max_pool2d`]: max pooling with any kernel, stride and padding, with a backward that
//!   routes each output gradient to the first maximum of its window (as PyTorch does).
//! - [`batch_norm_train`] (and [`batch_norm_relu_train`], with the ReLU fused): training-mode
//!   2-D batch normalisation with a fused analytic backward; also returns the batch statistics
//!   for the running averages.
//! - [`relu`] and [`add_relu`] (the end of a residual block): ReLU with a one-pass backward.
//! - [`causal_attention`]: fused causal scaled dot-product attention (FlashAttention's
//!   recomputing backward), never materialising the scores; [`packed_causal_attention`] the
//!   same over a packed q | k | v projection with grouped-query heads, on 16-bit GPU data
//!   through cuDNN's fused flash-attention engines (feature `cudnn`).
//! - [`cross_entropy_rows`]: per-row cross-entropy over the first `classes` columns, fused
//!   (a language model's padded vocabulary), with a one-pass backward.
//! - [`layer_norm`]: LayerNorm over the last dimension, fused forward and input gradient;
//!   [`rms_norm`] the Llama's RMSNorm through the same 16-bit kernels.
//! - The Llama's other ops: [`swiglu`] (`silu(gate) · up`, one pass each way),
//!   [`rotary_packed`] (rotary position embeddings on a packed q | k | v projection) and
//!   [`packed_attention`] (the packed fused attention as an op of Candle's autograd);
//!   [`packed_attention_with_dropout`] the same with dropout of the weights drawn inside
//!   cuDNN's fused attention (the GPT's attention dropout on 16-bit GPU data).
//! - [`gelu_tanh`]: GPT-2's GELU with an exact derivative; [`project`]: `x W` over the last
//!   dimension for `[in, out]` weights.
//! - [`embed_tokens`]: token plus position embeddings, graph-free, and their backward
//!   ([`embed_tokens_backward`]: the table's rows summed per id in token order, deterministic).
//! - [`copy_tensors`]: copies of many tensors, in one CUDA launch per 48 tensors.
//! - [`add_bias`] and [`column_sums`]: a bias added to every row, and its gradient, graph-free
//!   (one pass, and one GEMV); [`add_bias_residual`] the bias and a block's input added in one
//!   pass, [`residual_add`] two gradients summed.
//! - [`unscale_and_check`]: the loss scale undone in place with an inf/NaN check, one pass
//!   ([`unscale_and_check_by`] reading the scale on the device; [`update_loss_scale`] the
//!   scaler's rule on its state there).
//! - [`dropout`]: dropout masks from a seed and each element's place (reproducible on
//!   recomputation and across the ranks of a tensor-parallel group).
//! - `cuda_launch` (feature `cuda`): loading PTX modules and launching kernels on a device's
//!   compute stream, for weft's kernels here and in other crates (the optimizers').
//!
//! Each op also comes as a graph-free forward and its backward (`conv2d_forward` /
//! `conv2d_backward`, or [`conv2d_backward_add`] adding the input gradient in place, …) for
//! blocks that differentiate themselves ([`crate::ExplicitBackward`]), where [`has_kernels`]
//! says they apply.
//!
//! The CPU kernels handle f32 and f64, and bf16/f16 by computing in f32 inside. With the
//! `cuda` feature, batch norm, ReLU and max-pool on CUDA f32/f64/bf16/f16 tensors run the
//! kernels of `kernels/` ([`set_cuda_kernels`] turns them off); with the `cudnn` feature,
//! `conv2d` on CUDA tensors of those types runs cuDNN's forward, backward-data and
//! backward-filter convolutions. Other tensors are computed with Candle's own (differentiable)
//! ops.

mod attention;
mod attention_cpu;
#[cfg(feature = "cuda")]
mod attention_cuda;
mod attention_dropout;
#[cfg(feature = "cudnn")]
mod attention_dropout_cuda;
mod batch_norm;
mod batch_norm_cpu;
#[cfg(feature = "cuda")]
mod batch_norm_cuda;
mod batch_norm_eval;
#[cfg(feature = "cuda")]
mod batch_norm_nhwc_cuda;
mod batch_norm_op;
mod batch_norm_sums;
mod batch_norm_sync;
#[cfg(feature = "cuda")]
mod batch_norm_sync_cuda;
mod batch_norm_sync_op;
mod bias;
#[cfg(feature = "cuda")]
mod bias_cuda;
mod channels_last;
mod conv2d;
mod conv_add;
mod conv_cpu;
mod conv_crop;
#[cfg(feature = "cudnn")]
mod conv_cudnn;
#[cfg(feature = "cudnn")]
mod conv_nhwc;
mod conv_operands;
#[cfg(any(feature = "cudnn", test))]
mod conv_space_to_depth;
#[cfg(feature = "cudnn")]
mod conv_stats;
mod conv_stats_choice;
#[cfg(feature = "cudnn")]
mod conv_stats_plan;
mod cross_entropy;
#[cfg(feature = "cuda")]
mod cross_entropy_cuda;
#[cfg(feature = "cuda")]
pub mod cuda_launch;
#[cfg(feature = "cudnn")]
mod cudnn_backend;
#[cfg(feature = "cudnn")]
mod cudnn_graph;
#[cfg(feature = "cudnn")]
mod cudnn_plan;
#[cfg(feature = "cudnn")]
mod cudnn_search;
mod determinism;
#[cfg(feature = "cudnn")]
mod device_timing;
pub mod dropout;
#[cfg(feature = "cuda")]
mod dropout_cuda;
mod embedding;
#[cfg(feature = "cuda")]
mod embedding_cuda;
mod gelu;
#[cfg(feature = "cuda")]
mod gelu_cuda;
mod im2col;
mod layer_norm;
#[cfg(feature = "cuda")]
mod layer_norm_cuda;
mod loss_scale;
mod matmul;
mod max_pool;
mod max_pool_cpu;
#[cfg(feature = "cuda")]
mod max_pool_cuda;
#[cfg(feature = "cuda")]
mod max_pool_nhwc;
#[cfg(feature = "cuda")]
mod max_pool_nhwc_cuda;
mod multi_tensor;
#[cfg(feature = "cuda")]
mod multi_tensor_cuda;
mod packed_attention;
mod packed_attention_grad;
mod pixels;
#[cfg(feature = "cuda")]
mod pixels_cuda;
mod project;
mod relu;
#[cfg(feature = "cuda")]
mod relu_cuda;
mod residual;
#[cfg(feature = "cuda")]
mod residual_cuda;
mod rms_norm;
mod rotary;
#[cfg(feature = "cuda")]
mod rotary_cuda;
mod running_average;
#[cfg(feature = "cuda")]
mod running_average_cuda;
mod running_update;
mod scratch;
#[cfg(feature = "cudnn")]
mod sdpa_cudnn;
#[cfg(feature = "cudnn")]
mod sdpa_graph;
#[cfg(feature = "cudnn")]
mod sdpa_graph_backward;
#[cfg(feature = "cudnn")]
mod sdpa_support;
#[cfg(feature = "cudnn")]
mod space_to_depth_cuda;
mod storage;
mod swiglu;
#[cfg(feature = "cuda")]
mod swiglu_cuda;
#[cfg(feature = "cuda")]
mod transpose_cuda;
mod unscale;
#[cfg(feature = "cuda")]
mod unscale_cuda;

pub use attention::{
    causal_attention, causal_attention_backward, causal_attention_reference,
    causal_attention_saving, has_cuda_attention,
};
pub use attention_dropout::{
    fused_attention_dropout, packed_attention_with_dropout, packed_causal_attention_with_dropout,
    packed_causal_attention_with_dropout_backward, set_fused_attention_dropout, DroppedAttention,
};
pub use batch_norm::{
    batch_norm_relu_train, batch_norm_train, batch_norm_train_backward, batch_norm_train_forward,
    batch_norm_train_forward_add_relu, batch_norm_train_forward_add_relu_from_sums,
    batch_norm_train_forward_from_sums, BatchNormGrads, BatchNormOutput,
};
pub use batch_norm_eval::{batch_norm_eval, EvalStats};
pub use batch_norm_sync::BatchStats;
pub use bias::add_bias;
pub use channels_last::{is_channels_last, to_channels_last};
pub use conv2d::{
    conv2d, conv2d_backward, conv2d_filter_for, conv2d_forward, conv2d_forward_with_sums,
    set_conv_nhwc,
};
pub use conv_add::conv2d_backward_add;
#[cfg(feature = "cudnn")]
pub use conv_cudnn::set_allow_tf32;
pub use conv_operands::ConvOperands;
#[cfg(feature = "cudnn")]
pub use conv_stats::conv_stats_plans;
pub use conv_stats_choice::{conv_stats, set_conv_stats, ConvStats};
pub use cross_entropy::{cross_entropy_rows, cross_entropy_rows_and_grad, CrossEntropyRows};
#[cfg(feature = "cudnn")]
pub use cudnn_search::{
    ALGO_VAR as CUDNN_ALGO_VAR, LOG_VAR as CUDNN_LOG_VAR, WORKSPACE_VAR as CUDNN_WORKSPACE_VAR,
};
pub use determinism::{deterministic, set_deterministic};
pub use dropout::set_dropout_step;
pub use embedding::{embed_tokens, embed_tokens_backward, lookup_backward};
pub use gelu::{gelu_tanh, gelu_tanh_backward, gelu_tanh_derivative};
pub use layer_norm::{layer_norm, layer_norm_backward, layer_norm_reference};
pub use loss_scale::{update_loss_scale, ScaleRule, LOSS_SCALE_STATE_LEN};
pub use max_pool::{
    max_pool2d, max_pool2d_backward, max_pool2d_backward_saved, max_pool2d_forward,
    max_pool2d_forward_saving,
};
pub use multi_tensor::{copies_into, copy_tensors};
pub use packed_attention::{
    packed_causal_attention, packed_causal_attention_backward, PackedHeads,
};
pub use packed_attention_grad::packed_attention;
pub use pixels::{normalize_pixels, normalize_pixels_into, PixelNormalization};
pub use project::{column_sums, project};
pub use relu::{add_relu, add_relu_forward, relu, relu_backward};
pub use residual::{add_bias_residual, residual_add};
pub use rms_norm::{rms_norm, rms_norm_backward, rms_norm_reference};
pub use rotary::{rotary_packed, rotary_packed_backward, rotary_packed_reference};
pub use running_average::{blend_into, update_running_stats, RunningStats};
pub use running_update::RunningUpdate;
#[cfg(feature = "cudnn")]
pub use sdpa_support::fused_attention_plans;
pub use storage::{has_kernels, set_cuda_kernels};
pub use swiglu::{swiglu, swiglu_backward, swiglu_reference};
pub use unscale::{unscale_and_check, unscale_and_check_by};

#[cfg(test)]
mod tests;
