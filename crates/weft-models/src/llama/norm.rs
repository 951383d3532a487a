//! RMSNorm as Hugging Face's Llama computes it: `x / sqrt(mean(x²) + eps)` in f32 (f64 stays
//! f64), rounded back to the input's type, then scaled by the weight.

use candle_core::{DType, Tensor, Var, D};
use weft_tensor::{Result, Scope};

/// A root-mean-square normalisation over the last dimension, registered as `weight`.
pub struct RmsNorm {
    weight: Var,
    eps: f64,
}

impl RmsNorm {
    /// Registers `weight` (ones of `width`) in `scope`.
    pub fn new(scope: &mut Scope, width: usize, eps: f64) -> Result<Self> {
        let ones = Tensor::ones(width, scope.dtype(), &scope.device())?;
        Ok(Self {
            weight: scope.parameter("weight", ones)?,
            eps,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dtype = x.dtype();
        let wide = match dtype {
            DType::F64 => x.clone(),
            _ => x.to_dtype(DType::F32)?,
        };
        let mean_square = wide.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = wide.broadcast_div(&(mean_square + self.eps)?.sqrt()?)?;
        Ok(normed
            .to_dtype(dtype)?
            .broadcast_mul(self.weight.as_tensor())?)
    }
}
