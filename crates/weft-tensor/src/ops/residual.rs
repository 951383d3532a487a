//! A transformer block's residual sums, graph-free (for blocks that differentiate
//! themselves): [`add_bias_residual`], a row-wise projection's bias and the block's input added
//! to its product in one pass, and [`residual_add`], two same-shape tensors summed (the
//! gradients of a block's input, through its body and around it). On a GPU, bf16/f16 tensors
//! run `kernels/residual.cu` (16-byte vectors, each sum in f32 and rounded once: Candle's 16-bit
//! add indexes every element through strides, at a fifth of the memory's speed); other tensors
//! take [`super::add_bias`] and Candle's add, 16-bit CPU tensors computed in f32 and rounded once.

use candle_core::{bail, DType, Result, Tensor};

use super::bias::add_bias;
use super::storage::{is_half, widen};

/// `x + bias + residual` over the rows of a 2-d `x` (`bias` `[cols]`, `residual` shaped as `x`).
pub fn add_bias_residual(x: &Tensor, bias: &Tensor, residual: &Tensor) -> Result<Tensor> {
    let (_, cols) = x.dims2()?;
    if bias.dims() != [cols] || residual.dims() != x.dims() {
        bail!(
            "add_bias_residual: bias {:?} and residual {:?} for x {:?}",
            bias.dims(),
            residual.dims(),
            x.dims()
        );
    }
    #[cfg(feature = "cuda")]
    if super::storage::uses_cuda_half_kernels(&[x, bias, residual]) {
        return super::residual_cuda::add_bias_residual(x, bias, residual);
    }
    if is_half(&[x, bias, residual]) && x.device().is_cpu() {
        let sum = add_bias_residual(&widen(x)?, &widen(bias)?, &widen(residual)?)?;
        return sum.to_dtype(x.dtype());
    }
    add_bias(x, bias)? + residual
}

/// `a + b` for tensors of one shape and dtype, without an autograd graph.
pub fn residual_add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.dims() != b.dims() || a.dtype() != b.dtype() {
        bail!(
            "residual_add: {:?} {:?} and {:?} {:?}",
            a.dims(),
            a.dtype(),
            b.dims(),
            b.dtype()
        );
    }
    #[cfg(feature = "cuda")]
    if super::storage::uses_cuda_half_kernels(&[a, b]) {
        return super::residual_cuda::residual_add(a, b);
    }
    if matches!(a.dtype(), DType::BF16 | DType::F16) && a.device().is_cpu() {
        return (widen(a)? + widen(b)?)?.to_dtype(a.dtype());
    }
    (a + b)?.detach().contiguous()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Both sums by hand in f64, and in bf16 rounded once: 1 + 2^-8 + 2^-9 rounds to 1 + 2^-7
    /// in one step, where two steps (1 + 2^-8, a tie kept at 1, then + 2^-9) would give 1.
    #[test]
    fn sums_by_hand_and_rounded_once() -> Result<()> {
        let x = Tensor::new(&[[1f64, 2.], [3., 4.]], &Device::Cpu)?;
        let b = Tensor::new(&[10f64, 20.], &Device::Cpu)?;
        let r = Tensor::new(&[[0.5f64, 0.25], [0.125, 1.]], &Device::Cpu)?;
        let y = add_bias_residual(&x, &b, &r)?.to_vec2::<f64>()?;
        assert_eq!(y, [[11.5, 22.25], [13.125, 25.]]);
        assert_eq!(
            residual_add(&x, &r)?.to_vec2::<f64>()?,
            [[1.5, 2.25], [3.125, 5.]]
        );
        let one = |v: f64| Tensor::new(&[[v]], &Device::Cpu).and_then(|t| t.to_dtype(DType::BF16));
        let (x, r) = (one(1.0)?, one(2f64.powi(-9))?);
        let b = Tensor::new(&[2f64.powi(-8)], &Device::Cpu)?.to_dtype(DType::BF16)?;
        let y = add_bias_residual(&x, &b, &r)?
            .to_dtype(DType::F64)?
            .to_vec2::<f64>()?;
        assert_eq!(y[0][0], 1.0 + 2f64.powi(-7));
        Ok(())
    }

    /// Mismatched shapes are one-line errors naming them.
    #[test]
    fn mismatched_shapes_are_refused() {
        let x = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        let b = Tensor::zeros(4, DType::F32, &Device::Cpu).unwrap();
        let error = add_bias_residual(&x, &b, &x).unwrap_err().to_string();
        assert!(
            error.lines().next().unwrap().contains("bias [4]"),
            "{error}"
        );
        let y = Tensor::zeros((3, 2), DType::F32, &Device::Cpu).unwrap();
        assert!(residual_add(&x, &y).is_err());
    }
}
