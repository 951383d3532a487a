//! [`pixels_to_float`]: a batch's pixel bytes turned into the model's input where the batch
//! is, as torchvision's `ToTensor` and `Normalize` would on the host. On a GPU the host then
//! builds, copies and uploads a quarter of the bytes (one per channel instead of an f32), and
//! the conversion costs the device one pass over the batch ([`normalize_pixels`]), written
//! into a new tensor or straight into one that exists ([`pixels_to_float_into`]).

use candle_core::{DType, Tensor};
use weft_tensor::ops::{normalize_pixels, normalize_pixels_into, PixelNormalization};

use crate::{DataError, Normalize};

/// `pixels` (u8 `[N, H, W, C]`, C = 3) as `dtype` `[N, C, H, W]` in channels-last order (a
/// permuted view of NHWC storage): `x / 255`, then `(x − mean) · (1 / std)` per channel with
/// `normalize`, computed in f32 in the order the host's pipeline computes them, so that on the
/// CPU the result equals its values exactly.
pub fn pixels_to_float(
    pixels: &Tensor,
    normalize: Option<&Normalize>,
    dtype: DType,
) -> Result<Tensor, DataError> {
    check_pixels(pixels)?;
    let normalization = normalize.map(normalization);
    Ok(normalize_pixels(pixels, normalization, dtype)?.permute((0, 3, 1, 2))?)
}

/// [`pixels_to_float`] written into `out`, an `[N, C, H, W]` tensor of the pixels' sizes stored
/// channels-last (NHWC storage, e.g. a trainer's static input buffer), in `out`'s dtype.
pub fn pixels_to_float_into(
    pixels: &Tensor,
    normalize: Option<&Normalize>,
    out: &Tensor,
) -> Result<(), DataError> {
    let (n, h, w, c) = check_pixels(pixels)?;
    let storage_order = out.permute((0, 2, 3, 1))?;
    if out.dims() != [n, c, h, w] || !storage_order.is_contiguous() {
        return Err(DataError::InvalidConfig {
            field: "pixels",
            reason: format!(
                "cannot write [{n}, {h}, {w}, {c}] pixels into {:?} (channels-last: {})",
                out.dims(),
                storage_order.is_contiguous()
            ),
        });
    }
    let normalization = normalize.map(normalization);
    Ok(normalize_pixels_into(
        pixels,
        normalization,
        &storage_order,
    )?)
}

/// `(N, H, W, C)` of u8 `[N, H, W, 3]` pixels; an error naming what they are otherwise.
fn check_pixels(pixels: &Tensor) -> Result<(usize, usize, usize, usize), DataError> {
    let dims = pixels.dims4()?;
    if pixels.dtype() != DType::U8 || dims.3 != 3 {
        return Err(DataError::InvalidConfig {
            field: "pixels",
            reason: format!(
                "expected u8 [N, H, W, 3], got {:?} {:?}",
                pixels.dtype(),
                pixels.dims()
            ),
        });
    }
    Ok(dims)
}

/// The kernels' form of `normalize`: the mean and the reciprocal standard deviation.
fn normalization(normalize: &Normalize) -> PixelNormalization {
    PixelNormalization {
        mean: normalize.mean(),
        inv_std: normalize.std().map(|s| 1.0 / s),
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    /// Into a channels-last buffer: the values of a new tensor, bit for bit; a buffer stored
    /// NCHW or of other sizes is refused, naming the pixels.
    #[test]
    fn into_a_channels_last_buffer_equals_a_new_tensor() -> Result<(), DataError> {
        let bytes: Vec<u8> = (0..2 * 3 * 5 * 3).map(|i| (i * 29 % 256) as u8).collect();
        let pixels = Tensor::from_vec(bytes, (2, 3, 5, 3), &Device::Cpu)?;
        let normalize = Normalize::imagenet();
        let expected = pixels_to_float(&pixels, Some(&normalize), DType::BF16)?;
        let buffer =
            Tensor::zeros((2, 3, 5, 3), DType::BF16, &Device::Cpu)?.permute((0, 3, 1, 2))?;
        pixels_to_float_into(&pixels, Some(&normalize), &buffer)?;
        let values = |t: &Tensor| -> Result<Vec<f32>, DataError> {
            Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?)
        };
        assert_eq!(values(&buffer)?, values(&expected)?);
        let nchw = Tensor::zeros((2, 3, 3, 5), DType::BF16, &Device::Cpu)?;
        let refused = pixels_to_float_into(&pixels, None, &nchw).unwrap_err();
        assert!(refused.to_string().contains("pixels"), "{refused}");
        let other =
            Tensor::zeros((2, 3, 5, 4), DType::BF16, &Device::Cpu)?.permute((0, 3, 1, 2))?;
        assert!(pixels_to_float_into(&pixels, None, &other).is_err());
        Ok(())
    }
}
