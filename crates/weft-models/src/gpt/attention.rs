//! Causal multi-head self-attention over a fused query | key | value projection.
//!
//! The number of heads is read from the projection's width (`3 × heads × head_dim`), so the
//! same function serves the whole model and a tensor-parallel rank holding some of the heads.
//! This is the reference path: it materialises each head's `T × T` scores.

use candle_core::{DType, Device, Tensor, D};
use weft_tensor::{Result, TensorError};

/// `softmax(q kᵀ / sqrt(head_dim) + causal mask) v` for `qkv` `[B, T, 3W]`, returning
/// `[B, T, W]`; `dropout` (training only) drops attention weights. 16-bit scores are
/// normalised in f32.
pub fn causal_self_attention(qkv: &Tensor, head_dim: usize, dropout: f64) -> Result<Tensor> {
    let (b, t, fused) = qkv.dims3()?;
    if fused % (3 * head_dim) != 0 {
        return Err(TensorError::Block {
            block: "attention".into(),
            message: format!("fused width {fused} is not 3 x heads x head_dim {head_dim}"),
        });
    }
    let width = fused / 3;
    let heads = width / head_dim;
    let split = |i: usize| -> Result<Tensor> {
        Ok(qkv
            .narrow(2, i * width, width)?
            .reshape((b, t, heads, head_dim))?
            .transpose(1, 2)?
            .contiguous()?)
    };
    let (q, k, v) = (split(0)?, split(1)?, split(2)?);
    let scale = 1.0 / (head_dim as f64).sqrt();
    let scores = (q.matmul(&k.t()?.contiguous()?)? * scale)?;
    let narrow = matches!(scores.dtype(), DType::BF16 | DType::F16);
    let scores = if narrow {
        scores.to_dtype(DType::F32)?
    } else {
        scores
    };
    let masked = scores.broadcast_add(&causal_mask(t, scores.dtype(), qkv.device())?)?;
    let mut weights = candle_nn::ops::softmax(&masked, D::Minus1)?;
    if narrow {
        weights = weights.to_dtype(qkv.dtype())?;
    }
    if dropout > 0.0 {
        weights = candle_nn::ops::dropout(&weights, dropout as f32)?;
    }
    let y = weights.matmul(&v)?;
    Ok(y.transpose(1, 2)?.reshape((b, t, width))?)
}

/// `[T, T]`: 0 where a position may attend (itself and earlier ones), −∞ above the diagonal.
fn causal_mask(t: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    let values: Vec<f32> = (0..t * t)
        .map(|i| match i % t > i / t {
            true => f32::NEG_INFINITY,
            false => 0.0,
        })
        .collect();
    Ok(Tensor::from_vec(values, (t, t), device)?.to_dtype(dtype)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With queries and keys zero every allowed position weighs the same: position t's output
    /// is the mean of the values at 0..=t (the causal mask by hand).
    #[test]
    fn equal_scores_average_the_past() -> Result<()> {
        let values = [[1f64, 10.], [3., 20.], [8., 60.]];
        let mut rows = Vec::new();
        for v in values {
            rows.extend([0.0, 0.0, 0.0, 0.0, v[0], v[1]]);
        }
        let qkv = Tensor::from_vec(rows, (1, 3, 6), &Device::Cpu)?;
        let y = causal_self_attention(&qkv, 2, 0.0)?
            .squeeze(0)?
            .to_vec2::<f64>()?;
        assert_eq!(y[0], [1.0, 10.0]);
        assert_eq!(y[1], [2.0, 15.0]);
        assert!((y[2][0] - 4.0).abs() < 1e-12 && (y[2][1] - 30.0).abs() < 1e-12);
        Ok(())
    }

    /// Two heads of width 1: each attends with its own query and key.
    #[test]
    fn heads_attend_independently() -> Result<()> {
        // Position 1, head 0: q = 1, keys (0, ln 3): weights (1/4, 3/4). Head 1: q = 0: (1/2, 1/2).
        let ln3 = 3f64.ln();
        let qkv = Tensor::new(
            &[[[0f64, 0., 0., 0., 4., 8.], [1., 0., ln3, 0., 8., 2.]]],
            &Device::Cpu,
        )?;
        let y = causal_self_attention(&qkv, 1, 0.0)?
            .squeeze(0)?
            .to_vec2::<f64>()?;
        assert_eq!(y[0], [4.0, 8.0]);
        assert!((y[1][0] - 7.0).abs() < 1e-12, "{y:?}");
        assert!((y[1][1] - 5.0).abs() < 1e-12, "{y:?}");
        Ok(())
    }
}
