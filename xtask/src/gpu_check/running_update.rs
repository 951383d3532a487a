//! The running statistics blended by the table kernel of a graph-free training forward
//! (`BatchStats::LocalUpdating`) against the same forward with `Local` statistics followed by
//! the separate update (`update_running_stats`), both on the GPU: the same arithmetic in the
//! same order, so bit for bit.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_tensor::ops;

/// Elements whose bits differ between the two runs' running mean and variance (over both, as
/// a fraction), infinite when the batch counts differ; after two forwards of a random batch of
/// `dtype`, channels-last when `channels_last`.
pub(super) fn compare_running_update_in_kernel(
    gpu: &Device,
    dtype: DType,
    channels_last: bool,
) -> Result<f64> {
    let x = Tensor::randn(0.5f32, 1.0, (4, 64, 6, 6), gpu)?.to_dtype(dtype)?;
    let x = match channels_last {
        true => ops::to_channels_last(&x)?,
        false => x,
    };
    let (weight, bias) = (
        Tensor::ones(64, dtype, gpu)?,
        Tensor::zeros(64, dtype, gpu)?,
    );
    let start = Tensor::randn(1f32, 0.5, (2, 64), gpu)?.to_dtype(dtype)?;
    let run = |in_kernel: bool| -> Result<(Vec<f32>, i64)> {
        let (mean, var) = (start.get(0)?.copy()?, start.get(1)?.copy()?);
        let count = Tensor::new(5i64, gpu)?;
        let running = ops::RunningStats {
            mean: &mean,
            var: &var,
            count: &count,
        };
        for _ in 0..2 {
            let stats = match in_kernel {
                true => ops::BatchStats::LocalUpdating(ops::RunningUpdate {
                    stats: running,
                    momentum: 0.1,
                }),
                false => ops::BatchStats::Local,
            };
            let out = ops::batch_norm_train_forward(&x, &weight, &bias, 1e-5, true, stats)?;
            if !in_kernel {
                let scale = 144.0 / 143.0;
                ops::update_running_stats(running, &out.mean()?, &out.var()?, 0.1, scale)?;
            }
        }
        let both = Tensor::cat(&[&mean, &var], 0)?
            .to_dtype(DType::F32)?
            .to_vec1()?;
        Ok((both, count.to_scalar::<i64>()?))
    };
    let ((fused, fused_count), (separate, separate_count)) = (run(true)?, run(false)?);
    if fused_count != separate_count {
        return Ok(f64::INFINITY);
    }
    let differing = fused
        .iter()
        .zip(&separate)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    Ok(differing as f64 / fused.len() as f64)
}
