//! `unscale_and_check` on the CPU: the product in f32 (f64 for f64 buffers), rounded once; the
//! flag for the range only; bad arguments refused.

use crate::ops::unscale_and_check;
use candle_core::{DType, Device, Result, Tensor};

#[test]
fn products_are_rounded_once_from_the_buffers_computing_type() -> Result<()> {
    let third = 1.0 / 3.0;
    let g = Tensor::new(&[1f64, 2.0, 3.0], &Device::Cpu)?;
    let found = unscale_and_check(&g, 0..3, third)?;
    assert_eq!(found.to_vec1::<f32>()?, [0.0]);
    assert_eq!(g.to_vec1::<f64>()?, [third, 2.0 * third, 3.0 * third]);
    // f32: the factor is rounded to f32 first, as the CUDA kernel and PyTorch do.
    let g = Tensor::new(&[3f32, 7.0], &Device::Cpu)?;
    unscale_and_check(&g, 0..2, third)?;
    let f = third as f32;
    assert_eq!(g.to_vec1::<f32>()?, [3.0 * f, 7.0 * f]);
    // bf16: f32 product, one rounding.
    let g = Tensor::new(&[3f32, 7.0], &Device::Cpu)?.to_dtype(DType::BF16)?;
    unscale_and_check(&g, 1..2, third)?;
    let expected = [half::bf16::from_f32(3.0), half::bf16::from_f32(7.0 * f)];
    assert_eq!(g.to_vec1::<half::bf16>()?, expected);
    Ok(())
}

#[test]
fn bad_buffers_and_ranges_are_refused() -> Result<()> {
    let g = Tensor::zeros((2, 2), DType::F32, &Device::Cpu)?;
    assert!(unscale_and_check(&g, 0..1, 1.0).is_err());
    let g = Tensor::zeros(4, DType::F32, &Device::Cpu)?;
    let err = unscale_and_check(&g, 2..5, 1.0).unwrap_err().to_string();
    assert!(err.contains("2..5"), "{err}");
    let g = Tensor::zeros(4, DType::U32, &Device::Cpu)?;
    assert!(unscale_and_check(&g, 0..4, 1.0).is_err());
    Ok(())
}
