//! Hugging Face's `Conv1D`, GPT-2's linear layer: the weight is stored `[in, out]` (transposed
//! against `nn.Linear`) and `y = x W + b` over the last dimension of `x`.

use candle_core::{Tensor, Var};
use weft_tensor::ops::project;
use weft_tensor::{Result, Scope};

/// A projection with GPT-2's parameter layout (`weight` `[in, out]`, `bias` `[out]`).
pub struct Conv1D {
    weight: Var,
    bias: Var,
}

impl Conv1D {
    /// Registers `weight` (`[in, out]`) and `bias` (`[out]`) under `scope`.
    pub fn from_values(scope: &mut Scope, weight: Tensor, bias: Tensor) -> Result<Self> {
        Ok(Self {
            weight: scope.parameter("weight", weight)?,
            bias: scope.parameter("bias", bias)?,
        })
    }

    pub fn weight(&self) -> &Tensor {
        self.weight.as_tensor()
    }

    pub fn bias(&self) -> &Tensor {
        self.bias.as_tensor()
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = project(x, self.weight())?;
        Ok(y.broadcast_add(self.bias())?)
    }
}
