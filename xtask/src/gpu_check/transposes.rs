//! `ops::to_channels_last` on the GPU (the batched transposes of `kernels/transpose.cu`, by
//! tiles or by whole planes) against the CPU's permuted copy: the NHWC storage bit
//! for bit.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_tensor::ops;

/// Shapes `[N, C, H, W]` whose `C x HW` planes go by plane (a 3 x 3 filter's, RGB images', a
/// `40 x 25` one) and by tile (sides of 64 and 1,600).
const SHAPES: [[usize; 4]; 4] = [
    [64, 64, 3, 3],
    [5, 3, 32, 32],
    [8, 40, 5, 5],
    [2, 64, 40, 40],
];

/// The fraction of elements (over every shape) whose bits differ from the CPU's.
pub(super) fn compare_to_channels_last(gpu: &Device, dtype: DType) -> Result<f64> {
    let (mut differing, mut total) = (0usize, 0usize);
    for dims in SHAPES {
        let t = Tensor::randn(0f32, 1.0, &dims, &Device::Cpu)?.to_dtype(dtype)?;
        let expected = t.permute((0, 2, 3, 1))?.contiguous()?;
        let moved = ops::to_channels_last(&t.to_device(gpu)?)?;
        let got = moved.permute((0, 2, 3, 1))?.to_device(&Device::Cpu)?;
        let bits = |x: &Tensor| -> Result<Vec<u64>> {
            Ok(x.flatten_all()?
                .to_dtype(DType::F64)?
                .to_vec1::<f64>()?
                .iter()
                .map(|v| v.to_bits())
                .collect())
        };
        let (a, b) = (bits(&expected)?, bits(&got.contiguous()?)?);
        differing += a.iter().zip(&b).filter(|(x, y)| x != y).count();
        total += a.len();
    }
    Ok(differing as f64 / total as f64)
}
