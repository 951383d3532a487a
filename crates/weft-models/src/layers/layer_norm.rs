//! `LayerNorm` over the last dimension (PyTorch semantics: biased variance, `eps` inside the
//! square root), fused (weft-tensor's `layer_norm`: 16-bit inputs computed in f32 inside, by
//! 16-bit kernels on a GPU).

use candle_core::Tensor;
use weft_tensor::{ops, Result, Scope};

/// Layer normalisation with a learned scale (`weight`, initially 1) and shift (`bias`, 0).
pub struct LayerNorm {
    weight: candle_core::Var,
    bias: candle_core::Var,
    eps: f64,
}

impl LayerNorm {
    pub fn new(scope: &mut Scope, width: usize, eps: f64) -> Result<Self> {
        let (dtype, device) = (scope.dtype(), scope.device());
        Ok(Self {
            weight: scope.parameter("weight", Tensor::ones(width, dtype, &device)?)?,
            bias: scope.parameter("bias", Tensor::zeros(width, dtype, &device)?)?,
            eps,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        layer_norm(x, self.weight.as_tensor(), self.bias.as_tensor(), self.eps)
    }

    pub fn weight(&self) -> &Tensor {
        self.weight.as_tensor()
    }

    pub fn bias(&self) -> &Tensor {
        self.bias.as_tensor()
    }

    pub fn eps(&self) -> f64 {
        self.eps
    }
}

/// `(x - mean) / sqrt(var + eps) * weight + bias` over the last dimension of `x`, through
/// weft-tensor's fused kernel (16-bit values computed in f32 inside).
pub fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
    Ok(ops::layer_norm(x, weight, bias, eps)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// `[1, 3]` has mean 2 and variance 1: normalised `[-1, 1]` (up to eps), then scaled and
    /// shifted.
    #[test]
    fn normalises_by_hand() -> Result<()> {
        let x = Tensor::new(&[[1f64, 3.], [2., 2.]], &Device::Cpu)?;
        let w = Tensor::new(&[2f64, 3.], &Device::Cpu)?;
        let b = Tensor::new(&[0.5f64, -1.], &Device::Cpu)?;
        let y = layer_norm(&x, &w, &b, 0.0)?.to_vec2::<f64>()?;
        assert_eq!(y[0], [-1.5, 2.0]);
        // A constant row normalises to zero: only the shift remains.
        let y = layer_norm(&x, &w, &b, 1e-5)?.to_vec2::<f64>()?;
        assert_eq!(y[1], [0.5, -1.0]);
        Ok(())
    }
}
