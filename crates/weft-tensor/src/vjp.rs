//! Back-propagation from a given output gradient (a vector-Jacobian product) through Candle's
//! autograd, which can only start from a scalar with gradient one.
//!
//! The obvious scalar, `sum(y * g)`, costs a full-size product, a full-size reduction (on a GPU
//! Candle reduces to a single value in one thread block, milliseconds for a ResNet activation)
//! and both of their backward passes. Instead a custom op maps `y` to a constant zero and
//! reports `g` as the gradient of `y` in its backward: the same gradients with no extra work.

use candle_core::backend::BackendStorage;
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{backprop::GradStore, bail, CpuStorage, CustomOp1, DType, Layout, Shape, Tensor};

/// Gradients of everything `output` depends on, given the gradient `grad` of `output`
/// (same shape and dtype).
pub fn backward_from(output: &Tensor, grad: &Tensor) -> candle_core::Result<GradStore> {
    if output.shape() != grad.shape() || output.dtype() != grad.dtype() {
        bail!(
            "backward_from: gradient {:?} {:?} does not match output {:?} {:?}",
            grad.shape(),
            grad.dtype(),
            output.shape(),
            output.dtype()
        );
    }
    output
        .apply_op1(Seed {
            grad: grad.detach(),
        })?
        .backward()
}

/// `y -> 0` (a scalar of `y`'s dtype) whose backward hands out `grad` as the gradient of `y`.
struct Seed {
    grad: Tensor,
}

impl CustomOp1 for Seed {
    fn name(&self) -> &'static str {
        "weft-vjp-seed"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let zero = match storage.dtype() {
            DType::F32 => CpuStorage::F32(vec![0.0]),
            DType::F64 => CpuStorage::F64(vec![0.0]),
            DType::F16 => CpuStorage::F16(vec![half::f16::ZERO]),
            DType::BF16 => CpuStorage::BF16(vec![half::bf16::ZERO]),
            other => bail!("backward_from: cannot differentiate a {other:?} output"),
        };
        Ok((zero, Shape::from(())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &CudaStorage,
        _: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let device = storage.device().clone();
        let zero = match storage.dtype() {
            DType::F32 => CudaStorage::wrap_cuda_slice(device.alloc_zeros::<f32>(1)?, device),
            DType::F64 => CudaStorage::wrap_cuda_slice(device.alloc_zeros::<f64>(1)?, device),
            DType::F16 => CudaStorage::wrap_cuda_slice(device.alloc_zeros::<half::f16>(1)?, device),
            DType::BF16 => {
                CudaStorage::wrap_cuda_slice(device.alloc_zeros::<half::bf16>(1)?, device)
            }
            other => bail!("backward_from: cannot differentiate a {other:?} output"),
        };
        Ok((zero, Shape::from(())))
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        _grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        // The result is a constant: its own gradient (one) only marks where backward starts.
        Ok(Some(self.grad.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn gradients_equal_those_of_the_sum_of_products() -> candle_core::Result<()> {
        let x = Var::from_tensor(&Tensor::new(
            &[[1f64, -2., 3.], [0.5, 4., -1.]],
            &Device::Cpu,
        )?)?;
        let y = x.as_tensor().sqr()?.exp()?.sin()?;
        let g = Tensor::new(&[[0.3f64, -1.2, 2.0], [1.0, 0.25, -0.75]], &Device::Cpu)?;
        let ours = backward_from(&y, &g)?;
        let reference = y.mul(&g)?.sum_all()?.backward()?;
        let (a, b) = (
            ours.get(x.as_tensor()).expect("x has a gradient"),
            reference.get(x.as_tensor()).expect("x has a gradient"),
        );
        assert_eq!(a.to_vec2::<f64>()?, b.to_vec2::<f64>()?);
        Ok(())
    }

    #[test]
    fn a_mismatched_gradient_is_an_error() -> candle_core::Result<()> {
        let x = Var::new(&[1f32, 2.], &Device::Cpu)?;
        let y = x.as_tensor().exp()?;
        let wrong_shape = Tensor::new(&[1f32, 2., 3.], &Device::Cpu)?;
        assert!(backward_from(&y, &wrong_shape).is_err());
        let wrong_dtype = Tensor::new(&[1f64, 2.], &Device::Cpu)?;
        assert!(backward_from(&y, &wrong_dtype).is_err());
        Ok(())
    }
}
