//! The channels-last max-pool on the values that test its rules, bit for bit against the CPU:
//! negative windows, zeros of both signs (the pooled zero keeps the first maximum's sign), ties
//! of equal values, -inf and +inf, NaN in windows (pooled to NaN, the gradient to the first NaN)
//! and NaN and infinities in the gradients. With 16 channels the word-at-a-time kernels run
//! (`_pairs` for 16-bit types, `_masked` for the cells' backward), with 6 the per-channel ones.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_tensor::ops;

use super::Check;

/// One row per dtype and channel count.
pub(super) fn run(gpu: &Device, checks: &mut Vec<Check>) -> Result<()> {
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for channels in [16, 6] {
            checks.push(Check {
                name: format!(
                    "channels-last max_pool2d on signed zeros, infinities and NaN, bit for bit, \
                     {channels} ch, {dtype:?}"
                ),
                error: mismatches(gpu, dtype, channels)?,
                tolerance: 0.0,
            });
        }
    }
    Ok(())
}

/// The image sizes and strides the channels-last pool rows run (3 x 3 windows, padding 1): at
/// stride 2 the backward a thread per 2 x 2 cell (edge cells cut at 15), at stride 1 a thread per
/// pixel.
pub(super) const POOL_CASES: [(usize, usize); 3] = [(15, 2), (16, 2), (16, 1)];

/// The elements of `y` and `dx` (from the first maxima kept and found again) that differ from
/// the CPU's, over 3 x 3 windows of stride 2 on 15 x 15 and 16 x 16 images and stride 1 on
/// 16 x 16 (padding 1); infinite if a result lost its channels-last layout.
fn mismatches(gpu: &Device, dtype: DType, channels: usize) -> Result<f64> {
    let mut count = 0f64;
    for case in POOL_CASES {
        count += mismatches_of(gpu, dtype, channels, case)?;
    }
    Ok(count)
}

/// [`mismatches`] for one image size and stride.
fn mismatches_of(
    gpu: &Device,
    dtype: DType,
    channels: usize,
    (size, stride): (usize, usize),
) -> Result<f64> {
    let cpu = Device::Cpu;
    let image = channels * size * size;
    let x = special(
        &Tensor::randn(0f32, 1.0, 4 * image, &cpu)?.to_vec1()?,
        image,
    );
    let x = Tensor::from_vec(x, (4, channels, size, size), &cpu)?.to_dtype(dtype)?;
    let out = (size + 2 - 3) / stride + 1;
    let dy = Tensor::randn(0f32, 1.0, 4 * channels * out * out, &cpu)?.to_vec1::<f32>()?;
    let dy: Vec<f32> = dy
        .iter()
        .enumerate()
        .map(|(i, &v)| match i {
            i if i % 29 == 3 => f32::NAN,
            i if i % 31 == 5 => f32::INFINITY,
            _ => v,
        })
        .collect();
    let dy = Tensor::from_vec(dy, (4, channels, out, out), &cpu)?.to_dtype(dtype)?;
    let (expected, _) = pooled_four_ways(&cpu, &x, &dy, stride)?;
    let (got, kept) = pooled_four_ways(gpu, &x, &dy, stride)?;
    if !kept {
        return Ok(f64::INFINITY);
    }
    let mut count = 0usize;
    for (a, b) in expected.iter().zip(&got) {
        let (a, b) = (
            a.flatten_all()?.to_vec1::<f32>()?,
            b.flatten_all()?.to_vec1::<f32>()?,
        );
        count += a
            .iter()
            .zip(&b)
            .filter(|(a, b)| !(a.is_nan() && b.is_nan()) && a.to_bits() != b.to_bits())
            .count();
    }
    Ok(count as f64)
}

/// `y` and `dx` of 3 x 3 windows of `stride` and padding 1 (`max_pool2d_forward` and
/// `max_pool2d_backward`, then `max_pool2d_forward_saving` and `max_pool2d_backward_saved`) on
/// `device`, channels-last on a GPU, as f32 on the CPU; and whether every result kept the
/// channels-last layout and a GPU kept the first maxima as bytes.
pub(super) fn pooled_four_ways(
    device: &Device,
    x: &Tensor,
    dy: &Tensor,
    stride: usize,
) -> Result<(Vec<Tensor>, bool)> {
    let put = |t: &Tensor| -> Result<Tensor> {
        let t = t.to_device(device)?;
        Ok(match device.is_cuda() {
            true => ops::to_channels_last(&t)?,
            false => t,
        })
    };
    let (x, dy) = (put(x)?, put(dy)?);
    let y = ops::max_pool2d_forward(&x, 3, stride, 1)?;
    let dx = ops::max_pool2d_backward(&x, &y, &dy, 3, stride, 1)?;
    let (y_saving, saved) = ops::max_pool2d_forward_saving(&x, 3, stride, 1)?;
    let dx_saved = ops::max_pool2d_backward_saved(&x, &saved, &dy, 3, stride, 1)?;
    let results = [y, dx, y_saving, dx_saved];
    let kept = results.iter().all(ops::is_channels_last)
        && (device.is_cpu() || saved.dtype() == DType::U8);
    let on_cpu = results
        .iter()
        .map(|t| {
            t.to_device(&Device::Cpu)?
                .contiguous()?
                .to_dtype(DType::F32)
        })
        .collect::<candle_core::Result<Vec<_>>>()?;
    Ok((on_cpu, kept))
}

/// Four images of `image` values from `normal`: a ReLU's output (ties at +0), its negation
/// (-0 where it was 0, negative windows), the raw values with NaN, -inf and +inf sprinkled in,
/// and the values rounded to integers (ties of equal values, -0 from small negatives).
fn special(normal: &[f32], image: usize) -> Vec<f32> {
    normal
        .iter()
        .enumerate()
        .map(|(i, &v)| match i / image {
            0 => v.max(0.0),
            1 => -v.max(0.0),
            2 => match i % image {
                k if k % 37 == 1 => f32::NAN,
                k if k % 53 == 2 => f32::NEG_INFINITY,
                k if k % 41 == 3 => f32::INFINITY,
                _ => v,
            },
            _ => v.round(),
        })
        .collect()
}
