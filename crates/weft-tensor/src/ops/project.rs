//! `x W` over the last dimension of `x` for a weight stored `[in, out]` (Hugging Face's
//! Conv1D layout, and its tensor-parallel slices).

use candle_core::{DType, Tensor};

use crate::error::Result;

/// `x W` over the last dimension of `x` (any leading dimensions), for `W` `[in, out]`. On the
/// CPU, 16-bit operands are multiplied in f32 (Candle's CPU matmul has no 16-bit path) and the
/// product rounded back. A 2-d `x` is multiplied as it is: every reshape is a node of the
/// autograd graph whose backward costs a zero-filled accumulator and an add over the tensor.
pub fn project(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let dims = x.dims();
    let (inner, rows) = (dims[dims.len() - 1], x.elem_count() / dims[dims.len() - 1]);
    let flat = match dims.len() {
        2 => x.clone(),
        _ => x.reshape((rows, inner))?,
    };
    let y = if x.device().is_cpu() && matches!(x.dtype(), DType::BF16 | DType::F16) {
        flat.to_dtype(DType::F32)?
            .matmul(&weight.to_dtype(DType::F32)?)?
            .to_dtype(x.dtype())?
    } else {
        flat.matmul(weight)?
    };
    if dims.len() == 2 {
        return Ok(y);
    }
    let mut out = dims.to_vec();
    *out.last_mut().expect("x has a last dimension") = weight.dim(1)?;
    Ok(y.reshape(out)?)
}

/// The sum over the rows of a 2-d `x` (`[rows, cols]` to `[cols]`): a bias's or a LayerNorm
/// parameter's gradient. Computed as `1ᵀ x`, one matrix-vector product (on a GPU a cuBLAS call
/// reading `x` once; Candle's reduction over the first dimension walks it with strides).
pub fn column_sums(x: &Tensor) -> candle_core::Result<Tensor> {
    let (rows, cols) = x.dims2()?;
    let ones = Tensor::ones((1, rows), x.dtype(), x.device())?;
    ones.matmul(&x.contiguous()?)?.reshape(cols)
}
