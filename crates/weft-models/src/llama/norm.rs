//! RMSNorm as Hugging Face's Llama computes it: `x / sqrt(mean(x²) + eps)` in f32 (f64 stays
//! f64), scaled by the weight: weft-tensor's fused [`ops::rms_norm`] (16-bit values rounded
//! once, at the end).

use candle_core::{Tensor, Var};
use weft_tensor::{ops, Result, Scope};

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

    pub fn weight(&self) -> &Tensor {
        self.weight.as_tensor()
    }

    pub fn eps(&self) -> f64 {
        self.eps
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(ops::rms_norm(x, self.weight.as_tensor(), self.eps)?)
    }
}
