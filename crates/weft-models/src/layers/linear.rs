//! `Linear` with PyTorch's default initialisation: weight and bias uniform in
//! `±1/sqrt(in_features)` (`kaiming_uniform_(a=sqrt(5))`).

use candle_core::{DType, Tensor, Var};
use weft_tensor::{ops, ParamGrad, Scope};

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

    /// On the CPU, 16-bit inputs are multiplied in f32 (Candle's CPU matmul has no 16-bit
    /// path) and the output rounded back.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        affine(x, self.weight.as_tensor(), self.bias.as_tensor())
    }

    /// [`Linear::forward`] without an autograd graph, for blocks with their own backward.
    pub fn forward_graph_free(&self, x: &Tensor) -> Result<Tensor> {
        let (w, b) = (
            self.weight.as_tensor().detach(),
            self.bias.as_tensor().detach(),
        );
        affine(x, &w, &b)
    }

    /// The gradients of the input `x` ([rows, in]) and of the weight and bias, from the
    /// gradient `dy` ([rows, out]) of [`Linear::forward_graph_free`]'s output.
    pub fn backward(&self, x: &Tensor, dy: &Tensor) -> Result<(Tensor, [ParamGrad; 2])> {
        let w = self.weight.as_tensor().detach();
        let dx = ops::project(dy, &w)?;
        let dw = ops::project(&dy.t()?, x)?;
        let db = dy.sum(0)?;
        Ok((dx, [(self.weight.id(), dw), (self.bias.id(), db)]))
    }
}

/// `x w^T + b`, in f32 for 16-bit inputs on the CPU.
fn affine(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    if x.device().is_cpu() && matches!(x.dtype(), DType::BF16 | DType::F16) {
        let wide = |t: &Tensor| t.to_dtype(DType::F32);
        let y = wide(x)?.matmul(&wide(w)?.t()?)?.broadcast_add(&wide(b)?)?;
        return Ok(y.to_dtype(x.dtype())?);
    }
    Ok(x.matmul(&w.t()?)?.broadcast_add(b)?)
}
