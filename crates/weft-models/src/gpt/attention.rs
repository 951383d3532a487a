//! Causal multi-head self-attention over a fused query | key | value projection.
//!
//! The number of heads is read from the projection's width (`3 × heads × head_dim`), so the
//! same function serves the whole model and a tensor-parallel rank holding some of the heads.
//! The heads run weft-tensor's fused attention (the `T × T` scores never materialised). With
//! dropout of the attention weights, 16-bit data on a GPU runs cuDNN's fused attention with the
//! dropout drawn inside it (`ops::packed_attention_with_dropout`: cuDNN's own masks, so it
//! agrees with the other paths in distribution, not bit for bit); everything else (f32, the
//! CPU, a geometry cuDNN refuses) takes the reference path over the full scores, its masks
//! placed among the whole model's heads (a tensor-parallel rank drops what the whole model
//! drops for its heads).

use candle_core::Tensor;
use weft_tensor::ops::dropout::Dropout;
use weft_tensor::ops::PackedHeads;
use weft_tensor::{ops, Result, TensorError};

/// `softmax(q kᵀ / sqrt(head_dim) + causal mask) v` for `qkv` `[B, T, 3W]`, returning
/// `[B, T, W]`; `dropout` (training only) drops attention weights (`[B, heads, T, T]`).
pub fn causal_self_attention(
    qkv: &Tensor,
    head_dim: usize,
    dropout: Option<&Dropout>,
) -> Result<Tensor> {
    let (b, t, fused) = qkv.dims3()?;
    if fused % (3 * head_dim) != 0 {
        return Err(TensorError::Block {
            block: "attention".into(),
            message: format!("fused width {fused} is not 3 x heads x head_dim {head_dim}"),
        });
    }
    let width = fused / 3;
    let heads = width / head_dim;
    if let Some(dropout) = dropout {
        let packed = PackedHeads {
            heads,
            kv_heads: heads,
            head_dim,
        };
        if let Some(y) = ops::packed_attention_with_dropout(qkv, packed, dropout)? {
            return Ok(y);
        }
    }
    let split = |i: usize| -> Result<Tensor> {
        Ok(qkv
            .narrow(2, i * width, width)?
            .reshape((b, t, heads, head_dim))?
            .transpose(1, 2)?
            .contiguous()?)
    };
    let (q, k, v) = (split(0)?, split(1)?, split(2)?);
    let y = match dropout {
        Some(dropout) => ops::causal_attention_reference(&q, &k, &v, Some(dropout))?,
        None => ops::causal_attention(&q, &k, &v)?,
    };
    Ok(y.transpose(1, 2)?.reshape((b, t, width))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

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
        let y = causal_self_attention(&qkv, 2, None)?
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
        let y = causal_self_attention(&qkv, 1, None)?
            .squeeze(0)?
            .to_vec2::<f64>()?;
        assert_eq!(y[0], [4.0, 8.0]);
        assert!((y[1][0] - 7.0).abs() < 1e-12, "{y:?}");
        assert!((y[1][1] - 5.0).abs() < 1e-12, "{y:?}");
        Ok(())
    }
}
