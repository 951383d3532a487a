//! [`batch_norm_eval`]: 2-D batch normalisation in evaluation mode, with the running statistics
//! instead of the batch's, through the training forward's table kernels (`[mean; var; weight;
//! bias]` applied in one pass, the ReLU fused when asked): channels-last stays channels-last on
//! CUDA, 16-bit data is normalised with f32 statistics, and no autograd graph is built
//! (evaluation differentiates nothing), so an evaluation forward holds no temporaries.

use super::batch_norm::{channels_last_on_cuda, check_arguments};
use super::batch_norm_op::{BatchNormOp, BnPass};
use super::channels_last::{from_nhwc, nhwc};
use super::storage::uses_kernels_with_half;
use candle_core::{bail, DType, Result, Tensor};

/// The running statistics and affine parameters of one batch norm, each of shape `C`.
pub struct EvalStats<'a> {
    pub running_mean: &'a Tensor,
    pub running_var: &'a Tensor,
    pub weight: &'a Tensor,
    pub bias: &'a Tensor,
}

/// `y = (x - running_mean) / sqrt(running_var + eps) * weight + bias` per channel of `x`
/// (`N x C x H x W`), then `max(y, 0)` with `relu`. The tensors must take weft's kernels
/// ([`super::has_kernels`]); the result has `x`'s layout on CUDA (NCHW-contiguous elsewhere).
pub fn batch_norm_eval(x: &Tensor, stats: EvalStats, eps: f64, relu: bool) -> Result<Tensor> {
    check_arguments(x, stats.weight, stats.bias, eps)?;
    let c = stats.weight.elem_count();
    for (name, t) in [
        ("running_mean", stats.running_mean),
        ("running_var", stats.running_var),
    ] {
        if t.dims() != [c] {
            bail!(
                "batch_norm_eval: {name} has shape {:?}, expected [{c}]",
                t.dims()
            );
        }
    }
    if !uses_kernels_with_half(&[x, stats.weight, stats.bias]) {
        bail!(
            "batch_norm_eval: no weft kernel for {:?} tensors on {:?}",
            x.dtype(),
            x.device().location()
        );
    }
    let table_dtype = match x.dtype() {
        DType::BF16 | DType::F16 => DType::F32,
        other => other,
    };
    let rows = [
        stats.running_mean,
        stats.running_var,
        stats.weight,
        stats.bias,
    ]
    .map(|t| t.to_dtype(table_dtype));
    let table = Tensor::stack(&rows.into_iter().collect::<Result<Vec<_>>>()?, 0)?;
    if channels_last_on_cuda(x) {
        let pass = BatchNormOp::nhwc(BnPass::ForwardTable, eps, relu);
        return from_nhwc(&nhwc(x)?.apply_op2_no_bwd(&table, &pass)?);
    }
    let pass = BatchNormOp::new(BnPass::ForwardTable, eps, relu);
    x.contiguous()?.apply_op2_no_bwd(&table, &pass)
}
