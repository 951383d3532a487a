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

#[test]
fn the_scale_read_from_a_state_tensor_unscales_as_the_host_value() -> Result<()> {
    use crate::ops::unscale_and_check_by;
    let values = [3f32, -7.5, 1e-3, 65504.0];
    let by_value = Tensor::new(&values, &Device::Cpu)?;
    let by_state = Tensor::new(&values, &Device::Cpu)?;
    let state = Tensor::new(&[1024f64, 0.0, 0.0, 0.0], &Device::Cpu)?;
    unscale_and_check(&by_value, 0..4, 1.0 / 1024.0)?;
    let found = unscale_and_check_by(&by_state, 0..4, &state)?;
    assert_eq!(found.to_vec1::<f32>()?, [0.0]);
    assert_eq!(by_state.to_vec1::<f32>()?, by_value.to_vec1::<f32>()?);
    let bad_state = Tensor::new(&[1024f32], &Device::Cpu)?;
    assert!(unscale_and_check_by(&by_state, 0..4, &bad_state).is_err());
    Ok(())
}

/// The state's rule step for step against a hand trace: growth at the interval, backoff and a
/// counted skip on an overflow, the tracker restarting after either; no growth past f64's range.
#[test]
fn the_state_follows_the_scalers_rule() -> Result<()> {
    use crate::ops::update_loss_scale;
    let state = Tensor::new(&[65536f64, 0.0, 0.0, 0.0], &Device::Cpu)?;
    let flag = |v: f32| Tensor::new(&[v], &Device::Cpu);
    let rule = (2.0, 0.5, 3);
    let mut trace = Vec::new();
    for found in [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0] {
        update_loss_scale(&state, &flag(found)?, rule)?;
        trace.push(state.to_vec1::<f64>()?);
    }
    let expected: [[f64; 4]; 8] = [
        [65536.0, 1.0, 0.0, 0.0],
        [65536.0, 2.0, 0.0, 0.0],
        [131072.0, 0.0, 0.0, 0.0],
        [65536.0, 0.0, 1.0, 1.0],
        [65536.0, 1.0, 1.0, 0.0],
        [65536.0, 2.0, 1.0, 0.0],
        [32768.0, 0.0, 2.0, 1.0],
        [32768.0, 1.0, 2.0, 0.0],
    ];
    for (got, want) in trace.iter().zip(expected) {
        assert_eq!(got.as_slice(), want.as_slice());
    }
    let huge = Tensor::new(&[f64::MAX, 0.0, 0.0, 0.0], &Device::Cpu)?;
    update_loss_scale(&huge, &flag(0.0)?, (2.0, 0.5, 1))?;
    assert_eq!(huge.to_vec1::<f64>()?[0], f64::MAX);
    let short = Tensor::new(&[1f64, 0.0], &Device::Cpu)?;
    assert!(update_loss_scale(&short, &flag(0.0)?, rule).is_err());
    Ok(())
}
