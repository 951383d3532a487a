//! Hugging Face's `Conv1D`, GPT-2's linear layer: the weight is stored `[in, out]` (transposed
//! against `nn.Linear`) and `y = x W + b` over the last dimension of `x`.

use candle_core::{DType, Tensor, Var};
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

/// `x W` over the last dimension of `x` (any leading dimensions), for `W` `[in, out]`. On the
/// CPU, 16-bit operands are multiplied in f32 (Candle's CPU matmul has no 16-bit path) and the
/// product rounded back.
pub fn project(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let dims = x.dims();
    let (inner, rows) = (dims[dims.len() - 1], x.elem_count() / dims[dims.len() - 1]);
    let flat = x.reshape((rows, inner))?;
    let y = if x.device().is_cpu() && matches!(x.dtype(), DType::BF16 | DType::F16) {
        flat.to_dtype(DType::F32)?
            .matmul(&weight.to_dtype(DType::F32)?)?
            .to_dtype(x.dtype())?
    } else {
        flat.matmul(weight)?
    };
    let mut out = dims.to_vec();
    *out.last_mut().expect("x has a last dimension") = weight.dim(1)?;
    Ok(y.reshape(out)?)
}
