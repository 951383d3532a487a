//! `copy_tensors` on the CPU: copies between shapes of one length, 16-bit sources widened
//! exactly into f32 destinations, channels-last sources copied in their logical order, and the
//! pairs it refuses.

use crate::ops::{copies_into, copy_tensors, is_channels_last, to_channels_last};
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

/// A filter stored channels-last (as the NHWC convolutions give weight gradients) lands in a
/// flat destination in its `K x C x R x S` order, widened or not.
#[test]
fn channels_last_sources_are_copied_in_their_logical_order() -> Result<()> {
    let values: Vec<f32> = (0..2 * 3 * 2 * 2).map(|v| v as f32).collect();
    let filter = Tensor::from_vec(values.clone(), (2, 3, 2, 2), &Device::Cpu)?;
    for dtype in [DType::F32, DType::BF16] {
        let source = to_channels_last(&filter.to_dtype(dtype)?)?;
        assert!(is_channels_last(&source));
        let dst = Tensor::zeros(values.len(), DType::F32, &Device::Cpu)?;
        copy_tensors(&[(&source, &dst)])?;
        assert_eq!(dst.to_vec1::<f32>()?, values, "{dtype:?}");
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
