//! `blend_into` against hand-computed values, on a view with an offset (a row of a statistics
//! table), and its errors.

use super::support::values;
use crate::ops::blend_into;
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
