//! [`pixels_to_float`]: a batch's pixel bytes turned into the model's input where the batch
//! is, as torchvision's `ToTensor` and `Normalize` would on the host. On a GPU the host then
//! builds, copies and uploads a quarter of the bytes (one per channel instead of an f32), and
//! the conversion costs the device one pass over the batch ([`normalize_pixels`]).

use candle_core::{DType, Tensor};
use weft_tensor::ops::{normalize_pixels, PixelNormalization};

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
    let (_, _, _, channels) = pixels.dims4()?;
    if pixels.dtype() != DType::U8 || channels != 3 {
        return Err(DataError::InvalidConfig {
            field: "pixels",
            reason: format!(
                "expected u8 [N, H, W, 3], got {:?} {:?}",
                pixels.dtype(),
                pixels.dims()
            ),
        });
    }
    let normalization = normalize.map(|n| PixelNormalization {
        mean: n.mean(),
        inv_std: n.std().map(|s| 1.0 / s),
    });
    Ok(normalize_pixels(pixels, normalization, dtype)?.permute((0, 3, 1, 2))?)
}
