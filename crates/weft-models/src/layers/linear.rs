//! `Linear` with PyTorch's default initialisation: weight and bias uniform in
//! `±1/sqrt(in_features)` (`kaiming_uniform_(a=sqrt(5))`).

use candle_core::{Tensor, Var};
use weft_tensor::Scope;

use super::Init;
use weft_tensor::Result;

/// `y = x W^T + b`.
pub struct Linear {
    weight: Var,
    bias: Var,
}

impl Linear {
    pub fn new(
        scope: &mut Scope,
        init: &mut Init,
        in_features: usize,
        out_features: usize,
    ) -> Result<Self> {
        let bound = 1.0 / (in_features as f64).sqrt();
        let (dtype, device) = (scope.dtype(), scope.device());
        let w = init.uniform(&[out_features, in_features], bound, dtype, &device)?;
        let b = init.uniform(&[out_features], bound, dtype, &device)?;
        Ok(Self {
            weight: scope.parameter("weight", w)?,
            bias: scope.parameter("bias", b)?,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.matmul(&self.weight.t()?)?.broadcast_add(&self.bias)?)
    }
}
