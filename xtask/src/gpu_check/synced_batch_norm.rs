//! SyncBatchNorm's graph-free passes on channels-last GPU tensors, on one GPU: with two
//! identical ranks (a cross-rank sum that doubles, a gather that stacks two copies) the global
//! batch's statistics are the local ones, so every output must equal the local batch norm's.
//! This checks the global statistics' passes on the GPU (`kernels/batch_norm_sync.cu`: the
//! packed moments, their combination, the rescaled gradient sums) around the NHWC kernels; the
//! two-GPU DDP rows check the combination over real ranks.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_tensor::ops::{self, BatchStats};
use weft_tensor::CrossRankSum;

use super::single_ops::relative_error;
use super::Check;

/// Two ranks holding the same values.
struct TwoIdenticalRanks;

impl CrossRankSum for TwoIdenticalRanks {
    fn sum(&self, values: &Tensor) -> candle_core::Result<Tensor> {
        values * 2.0
    }

    fn sum_owned(&self, values: Tensor) -> candle_core::Result<Tensor> {
        values * 2.0
    }

    fn gather(&self, values: &Tensor) -> candle_core::Result<Tensor> {
        Tensor::stack(&[values, values], 0)
    }
}

/// Adds the rows to `checks`.
pub(super) fn run(gpu: &Device, checks: &mut Vec<Check>) -> Result<()> {
    // Global against local statistics differ by the combination's roundings: the mean as
    // (n·m + n·m) / 2n, the gradient sums as 2s · n / 2n, a few units of the statistics' f32
    // (2^-24 each), amplified through 1 / std into the outputs: 1e-5 of the largest value in
    // f32; in bf16 such a difference can move an output by one rounding unit (2^-8), doubled.
    for dtype in [DType::F32, DType::BF16] {
        for relu in [false, true] {
            checks.push(Check {
                name: format!(
                    "channels-last SyncBatchNorm{}, two identical ranks = local, {dtype:?}",
                    if relu { " + ReLU" } else { "" }
                ),
                error: global_against_local(gpu, dtype, relu)?,
                tolerance: match dtype {
                    DType::F32 => 1e-5,
                    _ => 2f64.powi(-7),
                },
            });
        }
    }
    Ok(())
}

/// The largest relative difference of output, table, input, weight and bias gradients between
/// the global and the local passes on the same channels-last tensors.
fn global_against_local(gpu: &Device, dtype: DType, relu: bool) -> Result<f64> {
    let draw = |shape: &[usize], mean: f32| -> Result<Tensor> {
        Ok(Tensor::randn(mean, 1.0, shape, gpu)?.to_dtype(dtype)?)
    };
    let x = ops::to_channels_last(&draw(&[8, 64, 14, 14], 3.0)?)?;
    let dy = ops::to_channels_last(&draw(&[8, 64, 14, 14], 0.0)?)?;
    let (weight, bias) = (draw(&[64], 1.0)?, draw(&[64], 0.0)?);
    let run = |stats: BatchStats<'_>| -> Result<Vec<Tensor>> {
        let out = ops::batch_norm_train_forward(&x, &weight, &bias, 1e-5, relu, stats)?;
        let relu_output = relu.then_some(&out.y);
        let g =
            ops::batch_norm_train_backward(&x, &out.table, relu_output, &dy, 1e-5, true, stats)?;
        Ok(vec![
            out.y,
            out.table,
            g.x.expect("asked for"),
            g.weight,
            g.bias,
        ])
    };
    let (global, local) = (
        run(BatchStats::Global(&TwoIdenticalRanks))?,
        run(BatchStats::Local)?,
    );
    local
        .iter()
        .zip(&global)
        .try_fold(0f64, |m, (l, g)| Ok(m.max(relative_error(l, g)?)))
}
