//! `copy_tensors` on the CPU: copies between shapes of one length, 16-bit sources widened
//! exactly into f32 destinations, and the pairs it refuses.

use crate::ops::{copies_into, copy_tensors};
use candle_core::{DType, Device, Result, Tensor};

#[test]
fn sixteen_bit_sources_are_widened_exactly_into_f32() -> Result<()> {
    let values = [1.5f32, -0.333_333_34, 65504.0, 1e-7, 0.0, -2.0];
    for dtype in [DType::BF16, DType::F16] {
        let src = Tensor::new(&values, &Device::Cpu)?
            .to_dtype(dtype)?
            .reshape((2, 3))?;
        let dst = Tensor::zeros(6, DType::F32, &Device::Cpu)?;
        copy_tensors(&[(&src, &dst)])?;
        let expected = src.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        assert_eq!(dst.to_vec1::<f32>()?, expected, "{dtype:?}");
    }
    Ok(())
}

#[test]
fn narrowing_and_mismatched_pairs_are_refused() -> Result<()> {
    let f32s = Tensor::zeros(4, DType::F32, &Device::Cpu)?;
    let bf16s = Tensor::zeros(4, DType::BF16, &Device::Cpu)?;
    assert!(!copies_into(DType::F32, DType::BF16));
    assert!(copies_into(DType::F16, DType::F32));
    let narrowing = copy_tensors(&[(&f32s, &bf16s)]).unwrap_err().to_string();
    assert!(narrowing.contains("pair 0"), "{narrowing}");
    let short = Tensor::zeros(3, DType::F32, &Device::Cpu)?;
    assert!(copy_tensors(&[(&short, &f32s)]).is_err());
    Ok(())
}
