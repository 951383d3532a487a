//! [`normalize_pixels`]: a batch's pixel bytes (u8, channels last, three channels) turned into
//! a model's input, as torchvision's `ToTensor` and `Normalize` compute it: `x / 255`, then
//! `(x − mean) · (1 / std)` per channel, in f32 in that order, rounded once to the input's
//! dtype. One pass (`kernels/pixels.cu` on a GPU; the CPU twin computes the same f32 operations
//! and equals Candle's element-wise ops exactly), into a new tensor or one that exists
//! ([`normalize_pixels_into`]).

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
use half::{bf16, f16};

/// Per-channel normalisation after the division by 255: `(x − mean) · inv_std`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PixelNormalization {
    pub mean: [f32; 3],
    pub inv_std: [f32; 3],
}

/// `pixels` (u8, last axis the three channels) as `dtype` of the same shape: `x / 255`, then
/// `(x − mean) · inv_std` per channel with `normalization`.
pub fn normalize_pixels(
    pixels: &Tensor,
    normalization: Option<PixelNormalization>,
    dtype: DType,
) -> Result<Tensor> {
    check("normalize_pixels", pixels, dtype)?;
    pixels.contiguous()?.apply_op1_no_bwd(&NormalizePixels {
        normalization,
        dtype,
    })
}

/// [`normalize_pixels`] written into `out` (as many elements as `pixels`, a float dtype,
/// contiguous: its elements in the pixels' order) instead of a new tensor, with `out`'s dtype:
/// a trainer's next batch straight into its captured step's input buffer. On a GPU one pass;
/// elsewhere the new tensor is copied in.
pub fn normalize_pixels_into(
    pixels: &Tensor,
    normalization: Option<PixelNormalization>,
    out: &Tensor,
) -> Result<()> {
    check("normalize_pixels_into", pixels, out.dtype())?;
    if out.elem_count() != pixels.elem_count() || !out.is_contiguous() {
        bail!(
            "normalize_pixels_into: the output {:?} is not contiguous or not of the pixels' {} \
             elements",
            out.dims(),
            pixels.elem_count()
        );
    }
    #[cfg(feature = "cuda")]
    if pixels.device().is_cuda() && out.device().same_device(pixels.device()) {
        return super::pixels_cuda::normalize_pixels_into(
            &pixels.contiguous()?,
            normalization,
            out,
        );
    }
    let values = normalize_pixels(pixels, normalization, out.dtype())?;
    super::copy_tensors(&[(&values, out)])
}

/// An error unless `pixels` are u8 with three channels last and `dtype` is a float type.
fn check(op: &str, pixels: &Tensor, dtype: DType) -> Result<()> {
    if pixels.dtype() != DType::U8 || pixels.dims().last() != Some(&3) {
        bail!(
            "{op}: expected u8 pixels with 3 channels last, got {:?} {:?}",
            pixels.dtype(),
            pixels.dims()
        );
    }
    if !matches!(dtype, DType::F32 | DType::F64 | DType::BF16 | DType::F16) {
        bail!("{op}: dtype {dtype:?} is not a float type");
    }
    Ok(())
}

struct NormalizePixels {
    normalization: Option<PixelNormalization>,
    dtype: DType,
}

impl NormalizePixels {
    /// One byte's value in f32, as the kernel computes it.
    fn value(&self, byte: u8, channel: usize) -> f32 {
        let v = byte as f32 / 255.0;
        match self.normalization {
            Some(n) => (v - n.mean[channel]) * n.inv_std[channel],
            None => v,
        }
    }

    fn values(&self, bytes: &[u8]) -> Vec<f32> {
        bytes
            .iter()
            .enumerate()
            .map(|(i, &b)| self.value(b, i % 3))
            .collect()
    }
}

impl CustomOp1 for NormalizePixels {
    fn name(&self) -> &'static str {
        "normalize_pixels"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let start = layout.start_offset();
        let bytes = &storage.as_slice::<u8>()?[start..start + layout.shape().elem_count()];
        let values = self.values(bytes);
        let out = match self.dtype {
            DType::F32 => CpuStorage::F32(values),
            DType::F64 => CpuStorage::F64(values.into_iter().map(f64::from).collect()),
            DType::BF16 => CpuStorage::BF16(values.into_iter().map(bf16::from_f32).collect()),
            DType::F16 => CpuStorage::F16(values.into_iter().map(f16::from_f32).collect()),
            other => bail!("normalize_pixels: dtype {other:?} is not a float type"),
        };
        Ok((out, layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        let out = super::pixels_cuda::normalize_pixels(
            (storage, layout),
            self.normalization,
            self.dtype,
        )?;
        Ok((out, layout.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Against Candle's element-wise ops in the same order, exactly, in every float dtype.
    #[test]
    fn equals_candles_element_wise_ops() -> Result<()> {
        let bytes: Vec<u8> = (0..2 * 5 * 4 * 3).map(|i| (i * 37 % 256) as u8).collect();
        let pixels = Tensor::from_vec(bytes, (2, 5, 4, 3), &Device::Cpu)?;
        let normalization = PixelNormalization {
            mean: [0.485, 0.456, 0.406],
            inv_std: [1.0 / 0.229, 1.0 / 0.224, 1.0 / 0.225],
        };
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            for norm in [None, Some(normalization)] {
                let mut x = pixels
                    .to_dtype(DType::F32)?
                    .broadcast_div(&Tensor::new(255f32, &Device::Cpu)?)?;
                if let Some(n) = norm {
                    x = x
                        .broadcast_sub(&Tensor::new(&n.mean, &Device::Cpu)?)?
                        .broadcast_mul(&Tensor::new(&n.inv_std, &Device::Cpu)?)?;
                }
                let expected = x.to_dtype(dtype)?.to_dtype(DType::F64)?.flatten_all()?;
                let got = normalize_pixels(&pixels, norm, dtype)?;
                assert_eq!(got.dims(), pixels.dims());
                assert_eq!(
                    got.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?,
                    expected.to_vec1::<f64>()?,
                    "{dtype:?} {norm:?}"
                );
            }
        }
        Ok(())
    }

    /// Into a tensor that exists: the same values as a new tensor, written in place (a view
    /// of a larger buffer keeps the rest); a wrong length or a strided output is refused.
    #[test]
    fn into_an_existing_tensor_equals_a_new_one() -> Result<()> {
        let bytes: Vec<u8> = (0..3 * 4 * 3).map(|i| (i * 53 % 256) as u8).collect();
        let pixels = Tensor::from_vec(bytes, (3, 4, 3), &Device::Cpu)?;
        let normalization = Some(PixelNormalization {
            mean: [0.5, 0.25, 0.125],
            inv_std: [2.0, 4.0, 8.0],
        });
        for dtype in [DType::F32, DType::BF16] {
            let expected = normalize_pixels(&pixels, normalization, dtype)?;
            let buffer = Tensor::full(7f32, 40, &Device::Cpu)?.to_dtype(dtype)?;
            let out = buffer.narrow(0, 2, 36)?;
            normalize_pixels_into(&pixels, normalization, &out)?;
            let wide = |t: &Tensor| t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>();
            assert_eq!(wide(&out)?, wide(&expected)?, "{dtype:?}");
            let kept = wide(&buffer)?;
            assert_eq!(
                [kept[0], kept[1], kept[38], kept[39]],
                [7.0; 4],
                "{dtype:?}"
            );
        }
        let short = Tensor::zeros(35, DType::F32, &Device::Cpu)?;
        assert!(normalize_pixels_into(&pixels, None, &short).is_err());
        let strided = Tensor::zeros((3, 12), DType::F32, &Device::Cpu)?.t()?;
        assert!(normalize_pixels_into(&pixels, None, &strided).is_err());
        Ok(())
    }

    #[test]
    fn refuses_what_is_not_three_channels_of_bytes() {
        let floats = Tensor::zeros((1, 2, 2, 3), DType::F32, &Device::Cpu).unwrap();
        assert!(normalize_pixels(&floats, None, DType::F32).is_err());
        let four = Tensor::zeros((1, 2, 2, 4), DType::U8, &Device::Cpu).unwrap();
        assert!(normalize_pixels(&four, None, DType::F32).is_err());
        let bytes = Tensor::zeros((1, 2, 2, 3), DType::U8, &Device::Cpu).unwrap();
        assert!(normalize_pixels(&bytes, None, DType::U8).is_err());
    }
}
