//! `batch_norm_train` and `batch_norm_relu_train`: training-mode 2-D batch normalisation,
//! optionally followed by a ReLU in the same pass. On f32/f64 tensors on the CPU or (feature
//! `cuda`) on a GPU, with `kernels/batch_norm.cu`, it is a fused custom op with an analytic
//! backward (`batch_norm_op`); elsewhere it is composed of Candle ops. The same computation
//! also comes graph-free, as a forward and a backward function, for blocks that differentiate
//! themselves; those take their statistics from this rank's batch or, through a sum over the
//! ranks, from the global one ([`BatchStats`]).

use super::batch_norm_op::{BatchNormOp, BnPass};
use super::batch_norm_sums::TableFromSums;
use super::batch_norm_sync::BatchStats;
use super::channels_last::{from_nhwc, is_channels_last, nhwc};
use super::relu::{add_relu_forward, relu, relu_backward};
use super::running_update::RunningUpdate;
use super::storage::{
    dims4, half_on_cpu, uses_cpu_kernels, uses_cuda_kernels_with_half, uses_kernels_with_half,
};
use candle_core::{bail, DType, Result, Tensor};

/// Normalises `x` (`N x C x H x W`) per channel with its batch mean and biased variance
/// over `N, H, W`, then scales by `weight` and shifts by `bias` (both of shape `C`):
/// `y = (x - mean) / sqrt(var + eps) * weight + bias`. Returns `(y, mean, var)`; `y` is
/// differentiable w.r.t. `x`, `weight` and `bias`, while `mean` and `var` (shape `C`,
/// biased variance; f32 for 16-bit `x` on weft's kernels) are detached, for updating running
/// statistics.
pub fn batch_norm_train(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    batch_norm(x, weight, bias, eps, false)
}

/// [`batch_norm_train`] followed by a ReLU, `(max(y, 0), mean, var)`, in one pass over `y`
/// forward and one backward.
pub fn batch_norm_relu_train(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    batch_norm(x, weight, bias, eps, true)
}

/// What [`batch_norm_train_forward`] computed: the output and what its backward needs.
#[derive(Debug, Clone)]
pub struct BatchNormOutput {
    /// The normalised (and, when asked, rectified) output.
    pub y: Tensor,
    /// `[mean; biased variance; weight; bias]`, `4 x C`.
    pub table: Tensor,
    /// With global statistics, `N / max(N − 1, 1)` for the global batch's N elements per
    /// channel, which unbiases the variance (shape `1`, on the device, the table's dtype);
    /// `None` with local ones (N·H·W of `x`, known on the host).
    pub unbiasing: Option<Tensor>,
}

impl BatchNormOutput {
    /// The batch mean per channel.
    pub fn mean(&self) -> Result<Tensor> {
        self.table.get(0)
    }

    /// The biased batch variance per channel.
    pub fn var(&self) -> Result<Tensor> {
        self.table.get(1)
    }
}

/// Gradients of a batch norm from [`batch_norm_train_backward`].
#[derive(Debug, Clone)]
pub struct BatchNormGrads {
    pub x: Option<Tensor>,
    pub weight: Tensor,
    pub bias: Tensor,
}

/// [`batch_norm_train`] (or, with `relu`, [`batch_norm_relu_train`]) without an autograd
/// graph, for blocks with their own backward, with the statistics `stats` says. The tensors
/// must take weft's kernels ([`super::has_kernels`]).
pub fn batch_norm_train_forward(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
    relu: bool,
    stats: BatchStats<'_>,
) -> Result<BatchNormOutput> {
    train_forward(x, None, (weight, bias), eps, relu, stats)
}

/// [`batch_norm_train_forward`] with this rank's statistics from `sums`, the per-channel
/// `[sum; sum of squares]` of `x` (`2 x C`, f32: [`super::conv2d_forward_with_sums`] gives
/// them) instead of from a pass over `x`; the variance is E[x²] − E[x]², clamped at zero.
pub fn batch_norm_train_forward_from_sums(
    x: &Tensor,
    sums: &Tensor,
    (weight, bias): (&Tensor, &Tensor),
    eps: f64,
    relu: bool,
    stats: BatchStats<'_>,
) -> Result<BatchNormOutput> {
    train_forward(x, Some(sums), (weight, bias), eps, relu, stats)
}

fn train_forward(
    x: &Tensor,
    sums: Option<&Tensor>,
    (weight, bias): (&Tensor, &Tensor),
    eps: f64,
    relu: bool,
    stats: BatchStats<'_>,
) -> Result<BatchNormOutput> {
    check_arguments(x, weight, bias, eps)?;
    let tensors = [x, weight, bias];
    if !uses_kernels_with_half(&tensors) {
        bail!(
            "batch_norm_train_forward: no weft kernel for {:?} tensors on {:?}",
            x.dtype(),
            x.device().location()
        );
    }
    let (weight, bias) = (weight.contiguous()?, bias.contiguous()?);
    if channels_last_on_cuda(x) {
        let (x, table, unbiasing) = nhwc_table(x, sums, (&weight, &bias), eps, stats)?;
        let y = x.apply_op2_no_bwd(&table, &BatchNormOp::nhwc(BnPass::ForwardTable, eps, relu))?;
        return Ok(BatchNormOutput {
            y: from_nhwc(&y)?,
            table,
            unbiasing,
        });
    }
    let x = x.contiguous()?;
    let op = BatchNormOp::new(BnPass::Table, eps, false);
    let (table, unbiasing) = statistics_table(&x, sums, (&weight, &bias), op, stats)?;
    let y = x.apply_op2_no_bwd(&table, &BatchNormOp::new(BnPass::ForwardTable, eps, relu))?;
    Ok(BatchNormOutput {
        y,
        table,
        unbiasing,
    })
}

/// [`batch_norm_train_forward`] without ReLU followed by `max(y + residual, 0)` (the end of a
/// residual block, [`super::add_relu_forward`]): one pass over channels-last CUDA data, where
/// `y` is never stored; the two passes otherwise. The returned output is the block's
/// (`max(y + residual, 0)`), the table the batch norm's; the results equal the two passes'.
pub fn batch_norm_train_forward_add_relu(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
    residual: &Tensor,
    stats: BatchStats<'_>,
) -> Result<BatchNormOutput> {
    train_forward_add_relu(x, None, (weight, bias), eps, residual, stats)
}

/// [`batch_norm_train_forward_add_relu`] with this rank's statistics from `sums`, as
/// [`batch_norm_train_forward_from_sums`] takes them.
pub fn batch_norm_train_forward_add_relu_from_sums(
    x: &Tensor,
    sums: &Tensor,
    (weight, bias): (&Tensor, &Tensor),
    eps: f64,
    residual: &Tensor,
    stats: BatchStats<'_>,
) -> Result<BatchNormOutput> {
    train_forward_add_relu(x, Some(sums), (weight, bias), eps, residual, stats)
}

fn train_forward_add_relu(
    x: &Tensor,
    sums: Option<&Tensor>,
    (weight, bias): (&Tensor, &Tensor),
    eps: f64,
    residual: &Tensor,
    stats: BatchStats<'_>,
) -> Result<BatchNormOutput> {
    if residual.dims() != x.dims() {
        bail!(
            "batch_norm_train_forward_add_relu: residual has shape {:?}, x {:?}",
            residual.dims(),
            x.dims()
        );
    }
    if !channels_last_on_cuda(x) {
        let out = train_forward(x, sums, (weight, bias), eps, false, stats)?;
        return Ok(BatchNormOutput {
            y: add_relu_forward(&out.y, residual)?,
            ..out
        });
    }
    check_arguments(x, weight, bias, eps)?;
    let affine = (&weight.contiguous()?, &bias.contiguous()?);
    let (x, table, unbiasing) = nhwc_table(x, sums, affine, eps, stats)?;
    let op = BatchNormOp::nhwc(BnPass::ForwardTableAddRelu, eps, false);
    let y = x.apply_op3_no_bwd(&table, &nhwc(residual)?, &op)?;
    Ok(BatchNormOutput {
        y: from_nhwc(&y)?,
        table,
        unbiasing,
    })
}

/// The NHWC view of channels-last `x` and the `[mean; var; weight; bias]` table `stats` says
/// (contiguous `weight` and `bias`), with the variance's unbiasing factor when global.
fn nhwc_table(
    x: &Tensor,
    sums: Option<&Tensor>,
    (weight, bias): (&Tensor, &Tensor),
    eps: f64,
    stats: BatchStats<'_>,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let x = nhwc(x)?;
    let op = BatchNormOp::nhwc(BnPass::Table, eps, false);
    let (table, unbiasing) = statistics_table(&x, sums, (weight, bias), op, stats)?;
    Ok((x, table, unbiasing))
}

/// The `[mean; var; weight; bias]` table of `x` (as `op`, a `Table` pass, reads it) that `stats`
/// says, with the variance's unbiasing factor when global; with
/// [`BatchStats::LocalUpdating`] the running statistics blended too, inside `op`'s last kernel
/// where it can.
fn statistics_table(
    x: &Tensor,
    sums: Option<&Tensor>,
    (weight, bias): (&Tensor, &Tensor),
    op: BatchNormOp,
    stats: BatchStats<'_>,
) -> Result<(Tensor, Option<Tensor>)> {
    let count = per_channel_count(x, weight)?;
    let update = match stats {
        BatchStats::LocalUpdating(update) => Some(update),
        _ => None,
    };
    let (table, updated) = match sums {
        Some(sums) => (table_from_sums(sums, x, (weight, bias))?, false),
        None => table_pass(x, (weight, bias), op, update, count)?,
    };
    if let (Some(update), false) = (update, updated) {
        update.apply(&table, count)?;
    }
    stats.combine(table, count)
}

/// `op` (a `Table` pass) over `x`: the table, and whether its last kernel blended it into
/// `update`'s running statistics (on CUDA, where [`RunningUpdate::target`] takes them).
fn table_pass(
    x: &Tensor,
    (weight, bias): (&Tensor, &Tensor),
    op: BatchNormOp,
    update: Option<RunningUpdate<'_>>,
    count: usize,
) -> Result<(Tensor, bool)> {
    #[cfg(feature = "cuda")]
    if let Some(target) = match update {
        Some(update) if x.device().is_cuda() => update.target(x, count)?,
        _ => None,
    } {
        return Ok((
            x.apply_op3_no_bwd(weight, bias, &op.updating(target))?,
            true,
        ));
    }
    #[cfg(not(feature = "cuda"))]
    let _ = (update, count);
    Ok((x.apply_op3_no_bwd(weight, bias, &op)?, false))
}

/// The `[mean; var; weight; bias]` table from `x`'s per-channel `sums` (`batch_norm_sums`).
fn table_from_sums(
    sums: &Tensor,
    x: &Tensor,
    (weight, bias): (&Tensor, &Tensor),
) -> Result<Tensor> {
    let count = per_channel_count(x, weight)? as f64;
    sums.apply_op3_no_bwd(weight, bias, &TableFromSums { count })
}

/// The elements per channel of `x` (either layout) for a batch norm with `weight`.
fn per_channel_count(x: &Tensor, weight: &Tensor) -> Result<usize> {
    Ok(x.elem_count() / weight.dim(0)?)
}

/// The gradients of the [`batch_norm_train_forward`]`(x, ..)` that gave the statistics
/// `table` (its [`BatchNormOutput::table`]), from the output gradient `dy`; the input's only
/// when `input_grad`. With the fused ReLU, `relu_output` is the forward's output `y` (its
/// mask); without it, the output need not be kept at all. On channels-last CUDA data the mask
/// is recomputed from `x` and `table` inside the backward kernels (the same values as `y`'s, no
/// separate ReLU pass). `stats` must be the forward's: with global statistics the input
/// gradient is the global batch's (the per-channel sums over every rank), while the weight and
/// bias gradients stay this rank's, for the data-parallel reduction to combine.
pub fn batch_norm_train_backward(
    x: &Tensor,
    table: &Tensor,
    relu_output: Option<&Tensor>,
    dy: &Tensor,
    eps: f64,
    input_grad: bool,
    stats: BatchStats<'_>,
) -> Result<BatchNormGrads> {
    if dy.dims() != x.dims() {
        bail!(
            "batch_norm_train_backward: dy has shape {:?}, x {:?}",
            dy.dims(),
            x.dims()
        );
    }
    if channels_last_on_cuda(x) {
        let (x, dy) = (nhwc(x)?, nhwc(dy)?);
        let op = |pass| BatchNormOp::nhwc(pass, eps, relu_output.is_some());
        let table = x.apply_op3_no_bwd(&dy, table, &op(BnPass::GradTable))?;
        let dx = match input_grad {
            true => {
                let grads = stats.combine_grads(&table, per_channel_count(&x, &table.get(0)?)?)?;
                Some(from_nhwc(&x.apply_op3_no_bwd(
                    &dy,
                    &grads,
                    &op(BnPass::GradInput),
                )?)?)
            }
            false => None,
        };
        return Ok(BatchNormGrads {
            x: dx,
            weight: table.get(4)?,
            bias: table.get(5)?,
        });
    }
    let dy = match relu_output {
        Some(y) => relu_backward(y, dy)?,
        None => dy.contiguous()?,
    };
    let x = x.contiguous()?;
    let table = x.apply_op3_no_bwd(&dy, table, &BatchNormOp::new(BnPass::GradTable, eps, false))?;
    let dx = match input_grad {
        true => {
            let grads = stats.combine_grads(&table, per_channel_count(&x, &table.get(0)?)?)?;
            Some(input_gradient(&x, &dy, &grads, eps)?)
        }
        false => None,
    };
    Ok(BatchNormGrads {
        x: dx,
        weight: table.get(4)?,
        bias: table.get(5)?,
    })
}

/// The backward passes of the differentiable op: the input gradient (when `input_grad`) and
/// the per-channel sums `[sum(dy * xhat); sum(dy)]`, which are the weight and bias gradients.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward_passes(
    x: &Tensor,
    affine: &Tensor,
    stats: &Tensor,
    y: &Tensor,
    dy: &Tensor,
    eps: f64,
    relu: bool,
    input_grad: bool,
) -> Result<(Option<Tensor>, Tensor)> {
    let dy = through_relu(y, dy, relu)?;
    let x = x.contiguous()?;
    let sums = x.apply_op3_no_bwd(&dy, stats, &BatchNormOp::new(BnPass::GradSums, eps, false))?;
    let dx = match input_grad {
        true => {
            let table = Tensor::cat(&[stats, &affine.to_dtype(stats.dtype())?, &sums], 0)?;
            Some(input_gradient(&x, &dy, &table, eps)?)
        }
        false => None,
    };
    Ok((dx, sums.to_dtype(affine.dtype())?))
}

/// The gradient of the normalised output from that of the output `y` (a ReLU's when `relu`).
fn through_relu(y: &Tensor, dy: &Tensor, relu: bool) -> Result<Tensor> {
    match relu {
        true => relu_backward(y, dy),
        false => dy.contiguous(),
    }
}

/// `dx` from the 6-row table `[mean; var; weight; bias; sum(dy * xhat); sum(dy)]`.
fn input_gradient(x: &Tensor, dy: &Tensor, table: &Tensor, eps: f64) -> Result<Tensor> {
    x.apply_op3_no_bwd(dy, table, &BatchNormOp::new(BnPass::GradInput, eps, false))
}

/// Whether the graph-free passes take `x` as channels-last data (its NHWC storage, on CUDA).
pub(super) fn channels_last_on_cuda(x: &Tensor) -> bool {
    x.device().is_cuda() && is_channels_last(x)
}

/// Checks the shapes of `x`, `weight` and `bias` and the value of `eps`.
pub(super) fn check_arguments(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<()> {
    let (n, c, h, w) = dims4(x.dims(), "batch_norm_train", "x")?;
    if n * h * w == 0 || c == 0 {
        bail!(
            "batch_norm_train: x {:?} has no elements to normalise",
            x.dims()
        );
    }
    for (name, param) in [("weight", weight), ("bias", bias)] {
        if param.dims() != [c] {
            bail!(
                "batch_norm_train: {name} has shape {:?}, expected [{c}] for x {:?}",
                param.dims(),
                x.dims()
            );
        }
    }
    if !(eps.is_finite() && eps >= 0.0) {
        bail!("batch_norm_train: eps must be finite and non-negative, got {eps}");
    }
    Ok(())
}

fn batch_norm(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
    relu_after: bool,
) -> Result<(Tensor, Tensor, Tensor)> {
    check_arguments(x, weight, bias, eps)?;
    let tensors = [x, weight, bias];
    if half_on_cpu(&tensors) {
        // Statistics and normalisation in f32; the output rounded back, the statistics kept.
        let wide = |t: &Tensor| t.to_dtype(DType::F32);
        let (y, mean, var) = batch_norm(&wide(x)?, &wide(weight)?, &wide(bias)?, eps, relu_after)?;
        return Ok((y.to_dtype(x.dtype())?, mean, var));
    }
    if !uses_cpu_kernels(&tensors) && !uses_cuda_kernels_with_half(&tensors) {
        let (y, mean, var) = batch_norm_train_candle(x, weight, bias, eps)?;
        let y = if relu_after { relu(&y)? } else { y };
        return Ok((y, mean, var));
    }
    let x = x.contiguous()?;
    let stats = x.apply_op1_no_bwd(&BatchNormOp::new(BnPass::Moments, eps, false))?;
    let affine = Tensor::stack(&[weight, bias], 0)?;
    let y = x.apply_op3(
        &affine,
        &stats,
        BatchNormOp::new(BnPass::Forward, eps, relu_after),
    )?;
    Ok((y, stats.get(0)?, stats.get(1)?))
}

/// The same computation from Candle ops (differentiable by Candle's autograd).
pub(super) fn batch_norm_train_candle(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let per_channel = (1, weight.dim(0)?, 1, 1);
    let mean = x.mean_keepdim((0, 2, 3))?;
    let centered = x.broadcast_sub(&mean)?;
    let var = centered.sqr()?.mean_keepdim((0, 2, 3))?;
    let inv_std = (var.clone() + eps)?.sqrt()?.recip()?;
    let y = centered
        .broadcast_mul(&inv_std)?
        .broadcast_mul(&weight.reshape(per_channel)?)?
        .broadcast_add(&bias.reshape(per_channel)?)?;
    Ok((y, mean.flatten_all()?.detach(), var.flatten_all()?.detach()))
}
