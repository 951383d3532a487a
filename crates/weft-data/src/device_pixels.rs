//! [`pixels_to_float`]: a batch's pixel bytes turned into the model's input where the batch
//! is, as torchvision's `ToTensor` and `Normalize` would on the host. On a GPU the host then
//! builds, copies and uploads a quarter of the bytes (one per channel instead of an f32), and
//! the conversion costs the device five element-wise passes over the batch (the cast, the
//! division, the two per-channel operations, the cast to the compute dtype).

use candle_core::{DType, Tensor};

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
    let device = pixels.device();
    let mut x = pixels
        .to_dtype(DType::F32)?
        .broadcast_div(&Tensor::new(255f32, device)?)?;
    if let Some(normalize) = normalize {
        let inverse_std = normalize.std().map(|s| 1.0 / s);
        x = x
            .broadcast_sub(&Tensor::new(&normalize.mean(), device)?)?
            .broadcast_mul(&Tensor::new(&inverse_std, device)?)?;
    }
    Ok(x.to_dtype(dtype)?.permute((0, 3, 1, 2))?)
}
