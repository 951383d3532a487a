//! gpu-check's rows of data movement and statistics on the device: a batch's pixels normalised
//! and uploaded beside the compute, running statistics blended and updated, channels-last
//! transposes, the loss scale undone with its inf/NaN check, and the multi-tensor copies into
//! the flat gradient buffer (16-bit widened, channels-last filters transposed on the way).

use anyhow::Result;
use candle_core::{DType, Device};

use super::single_ops::{
    self, compare_blend, compare_multi_tensor, compare_unscale, compare_update_running,
};
use super::{running_update, transposes, Check};

/// Pushes the rows of data movement and statistics onto `checks`.
pub(super) fn rows(gpu: &Device, checks: &mut Vec<Check>) -> Result<()> {
    // A batch's pixels converted and normalised on the device (the trainer's GPU input).
    for (dtype, tolerance) in [(DType::F32, 1e-6), (DType::BF16, 8e-3)] {
        checks.push(Check {
            name: format!("pixels to normalised {dtype:?}, channels-last"),
            error: single_ops::compare_pixels(gpu, dtype)?,
            // f32: one rounding of the division by 255 apart at most; bf16: that, rounded.
            tolerance,
        });
    }
    checks.push(Check {
        name: "batches uploaded on a copy stream while the device computes".into(),
        error: single_ops::compare_batch_uploads(gpu)?,
        tolerance: 0.0,
    });
    checks.push(Check {
        name: "blend_into (running statistics)".into(),
        error: compare_blend(gpu, DType::F32)?,
        tolerance: 1e-6,
    });
    checks.push(Check {
        name: "update_running_stats (mean, variance, count in one launch)".into(),
        error: compare_update_running(gpu, DType::F32)?,
        tolerance: 1e-6,
    });
    for dtype in [DType::BF16, DType::F32, DType::F64] {
        checks.push(Check {
            name: format!("to_channels_last by tiles and by planes, {dtype:?}"),
            error: transposes::compare_to_channels_last(gpu, dtype)?,
            tolerance: 0.0,
        });
    }
    for dtype in [DType::F32, DType::BF16] {
        for channels_last in [false, true] {
            let layout = if channels_last {
                "channels-last"
            } else {
                "NCHW"
            };
            checks.push(Check {
                name: format!("running statistics updated by the table kernel, {layout} {dtype:?}"),
                error: running_update::compare_running_update_in_kernel(gpu, dtype, channels_last)?,
                tolerance: 0.0,
            });
        }
    }
    // The loss scale undone with the inf/NaN check, one pass: the same f32 products.
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        checks.push(Check {
            name: format!("unscale_and_check, {dtype:?}"),
            error: compare_unscale(gpu, dtype)?,
            tolerance: 0.0,
        });
    }
    // Copies, and 16-bit gradients widened into an f32 buffer (exact either way).
    for (dtype, into) in [
        (DType::F32, DType::F32),
        (DType::F64, DType::F64),
        (DType::BF16, DType::F32),
        (DType::F16, DType::F32),
    ] {
        checks.push(Check {
            name: format!("copy_tensors, 61 tensors, {dtype:?} into {into:?}"),
            error: compare_multi_tensor(gpu, dtype, into, (false, false))?,
            tolerance: 0.0,
        });
    }
    for dtype in [DType::BF16, DType::F16] {
        checks.push(Check {
            name: format!("copy_tensors, 61 tensors, {dtype:?} and F32 into F32 in one launch"),
            error: compare_multi_tensor(gpu, dtype, DType::F32, (true, false))?,
            tolerance: 0.0,
        });
    }
    // Channels-last filters (convolutions' weight gradients) transposed by the copy itself.
    for (dtype, into, mixed) in [
        (DType::F32, DType::F32, false),
        (DType::BF16, DType::BF16, false),
        (DType::BF16, DType::F32, true),
        (DType::F16, DType::F32, true),
    ] {
        checks.push(Check {
            name: format!(
                "copy_tensors, 61 tensors, channels-last filters, {dtype:?}{} into {into:?}",
                if mixed { " and F32" } else { "" }
            ),
            error: compare_multi_tensor(gpu, dtype, into, (mixed, true))?,
            tolerance: 0.0,
        });
    }
    Ok(())
}
