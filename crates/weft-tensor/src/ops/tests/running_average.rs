//! `blend_into` against hand-computed values, on a view with an offset (a row of a statistics
//! table), and its errors; `update_running_stats` the same, counting the batches in place.

use super::support::values;
use crate::ops::{blend_into, update_running_stats, RunningStats};
use candle_core::{DType, Device, Result, Tensor};

#[test]
fn blends_in_place_from_a_row_of_a_table() -> Result<()> {
    for dtype in [DType::F32, DType::F64] {
        let running = Tensor::new(&[1f64, 2.], &Device::Cpu)?.to_dtype(dtype)?;
        let stats = Tensor::new(&[[9f64, 9.], [3., 5.]], &Device::Cpu)?.to_dtype(dtype)?;
        blend_into(&running, &stats.get(1)?, 0.1, 2.0)?;
        // 0.9 * 1 + 0.1 * 2 * 3 and 0.9 * 2 + 0.1 * 2 * 5.
        let got = values(&running);
        assert!(
            (got[0] - 1.5).abs() < 1e-6 && (got[1] - 2.8).abs() < 1e-6,
            "{dtype:?}: {got:?}"
        );
    }
    Ok(())
}

#[test]
fn mismatched_tensors_are_errors() -> Result<()> {
    let running = Tensor::new(&[1f32, 2.], &Device::Cpu)?;
    assert!(blend_into(
        &running,
        &Tensor::new(&[1f32, 2., 3.], &Device::Cpu)?,
        0.1,
        1.0
    )
    .is_err());
    assert!(blend_into(&running, &Tensor::new(&[1f64, 2.], &Device::Cpu)?, 0.1, 1.0).is_err());
    Ok(())
}

#[test]
fn updates_mean_variance_and_count_in_place() -> Result<()> {
    for dtype in [DType::F32, DType::F64] {
        let mean = Tensor::new(&[1f64, 2.], &Device::Cpu)?.to_dtype(dtype)?;
        let var = Tensor::new(&[4f64, 8.], &Device::Cpu)?.to_dtype(dtype)?;
        let count = Tensor::new(3i64, &Device::Cpu)?;
        let table = Tensor::new(&[[3f64, 5.], [10., 20.]], &Device::Cpu)?.to_dtype(dtype)?;
        let stats = RunningStats {
            mean: &mean,
            var: &var,
            count: &count,
        };
        update_running_stats(stats, &table.get(0)?, &table.get(1)?, 0.1, 2.0)?;
        // 0.9 * 1 + 0.1 * 3, 0.9 * 2 + 0.1 * 5; 0.9 * 4 + 0.1 * 2 * 10, 0.9 * 8 + 0.1 * 2 * 20.
        let (m, v) = (values(&mean), values(&var));
        let expected = [(m[0], 1.2), (m[1], 2.3), (v[0], 5.6), (v[1], 11.2)];
        for (got, want) in expected {
            assert!((got - want).abs() < 1e-5, "{dtype:?}: {m:?} {v:?}");
        }
        assert_eq!(count.to_scalar::<i64>()?, 4, "{dtype:?}");
    }
    Ok(())
}

/// A graph-free training forward with `BatchStats::LocalUpdating` blends the batch's mean and
/// unbiased variance into the running statistics and counts the batch, in both layouts; with
/// `Local` it leaves them alone. Channel 0 holds 1, 2, 3, 4 (mean 2.5, unbiased variance 5/3),
/// channel 1 four 7s (variance 0).
#[test]
fn a_forward_with_local_updating_statistics_blends_them() -> Result<()> {
    use crate::ops::{batch_norm_train_forward, to_channels_last, BatchStats, RunningUpdate};
    let x =
        Tensor::new(&[1f32, 2., 7., 7., 3., 4., 7., 7.], &Device::Cpu)?.reshape((2, 2, 1, 2))?;
    let (weight, bias) = (
        Tensor::ones(2, DType::F32, &Device::Cpu)?,
        Tensor::zeros(2, DType::F32, &Device::Cpu)?,
    );
    for (layout, x) in [
        ("NCHW", x.clone()),
        ("channels-last", to_channels_last(&x)?),
    ] {
        for updating in [false, true] {
            let mean = Tensor::new(&[1f32, 2.], &Device::Cpu)?;
            let var = Tensor::new(&[4f32, 8.], &Device::Cpu)?;
            let count = Tensor::new(3i64, &Device::Cpu)?;
            let running = RunningStats {
                mean: &mean,
                var: &var,
                count: &count,
            };
            let stats = match updating {
                true => BatchStats::LocalUpdating(RunningUpdate {
                    stats: running,
                    momentum: 0.1,
                }),
                false => BatchStats::Local,
            };
            batch_norm_train_forward(&x, &weight, &bias, 1e-5, false, stats)?;
            let (m, v) = (values(&mean), values(&var));
            // 0.9 * 1 + 0.1 * 2.5, 0.9 * 2 + 0.1 * 7; 0.9 * 4 + 0.1 * 5/3, 0.9 * 8 + 0.1 * 0.
            let expected = match updating {
                true => [1.15, 2.5, 3.6 + 1.0 / 6.0, 7.2],
                false => [1.0, 2.0, 4.0, 8.0],
            };
            for (got, want) in [m[0], m[1], v[0], v[1]].into_iter().zip(expected) {
                assert!(
                    (got - want).abs() < 1e-5,
                    "{layout}, updating {updating}: {m:?} {v:?}"
                );
            }
            let batches = count.to_scalar::<i64>()?;
            assert_eq!(batches, 3 + i64::from(updating), "{layout}");
        }
    }
    Ok(())
}
