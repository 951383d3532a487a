//! GELU with the tanh approximation (GPT-2's `gelu_new`):
//! `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`, with the exact derivative.
//!
//! Candle's own `gelu` computes the same forward, but its backward rounds the constants to six
//! digits (a relative gradient error near 1e-7, visible in f64 checks); this op keeps Candle's
//! forward kernel and differentiates exactly, in one pass (`kernels/gelu.cu` on a GPU) where
//! weft's kernels apply. CUDA bf16/f16 tensors run `kernels/gelu.cu` both ways, 16-bit values
//! in and out in 16-byte vectors and f32 inside (`tanhf`), each result rounded once; on the
//! CPU, 16-bit tensors keep Candle's forward and their backward is computed in f32.

use candle_core::backend::BackendStorage;
use candle_core::op::Gelu;
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};

use super::storage::{
    is_half, run_kernel, uses_cpu_kernels, uses_cuda_half_kernels, uses_cuda_kernels, widen, Arg,
    CpuKernel, Float,
};

const SQRT_TWO_OVER_PI: f64 = 0.797_884_560_802_865_4;
const CUBIC: f64 = 0.044_715;

/// `gelu_tanh(x)`, differentiable.
pub fn gelu_tanh(x: &Tensor) -> candle_core::Result<Tensor> {
    match uses_cuda_half_kernels(&[x]) {
        true => x.contiguous()?.apply_op1(GeluTanh::<true>),
        false => x.apply_op1(GeluTanh::<false>),
    }
}

/// `d gelu_tanh / dx` at `x`:
/// `0.5 (1 + t) + 0.5 x (1 - t²) sqrt(2/π) (1 + 3 · 0.044715 x²)` with `t` the tanh above.
pub fn gelu_tanh_derivative(x: &Tensor) -> candle_core::Result<Tensor> {
    let x2 = x.sqr()?;
    let inner = ((x * SQRT_TWO_OVER_PI)? * ((&x2 * CUBIC)? + 1.0)?)?;
    let t = inner.tanh()?;
    let slope = ((&x2 * (3.0 * CUBIC * SQRT_TWO_OVER_PI))? + SQRT_TWO_OVER_PI)?;
    let outer = ((&t + 1.0)? * 0.5)?;
    let chain = ((x * 0.5)? * (t.sqr()?.neg()? + 1.0)?)?;
    outer + (chain * slope)?
}

/// The op, its forward Candle's kernel or (`HALF_KERNEL`, for a contiguous 16-bit CUDA input)
/// `kernels/gelu.cu`'s.
struct GeluTanh<const HALF_KERNEL: bool>;

impl<const HALF_KERNEL: bool> CustomOp1 for GeluTanh<HALF_KERNEL> {
    fn name(&self) -> &'static str {
        "weft-gelu-tanh"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        Ok((storage.unary_impl::<Gelu>(layout)?, layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let y = match HALF_KERNEL {
            true => super::gelu_cuda::forward((storage, layout))?,
            false => storage.unary_impl::<Gelu>(layout)?,
        };
        Ok((y, layout.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(gelu_tanh_backward(x, dy)?))
    }
}

/// `dy · gelu'(x)`, the gradient of [`gelu_tanh`] without an autograd graph (one fused pass
/// where the kernels apply).
pub fn gelu_tanh_backward(x: &Tensor, dy: &Tensor) -> candle_core::Result<Tensor> {
    if x.shape() != dy.shape() {
        bail!(
            "gelu_tanh_backward: x {:?} and dy {:?} differ",
            x.dims(),
            dy.dims()
        );
    }
    let tensors = [x, dy];
    let half_kernels = uses_cuda_half_kernels(&tensors);
    if is_half(&tensors) && !half_kernels {
        return gelu_tanh_backward(&widen(x)?, &widen(dy)?)?.to_dtype(x.dtype());
    }
    match half_kernels || uses_cpu_kernels(&tensors) || uses_cuda_kernels(&tensors) {
        true => x
            .contiguous()?
            .apply_op2_no_bwd(&dy.contiguous()?, &GeluTanhBackward),
        false => dy * gelu_tanh_derivative(x)?,
    }
}

/// `(x, dy) -> dy · gelu'(x)` in one pass (kernels/gelu.cu on a GPU).
struct GeluTanhBackward;

impl CpuKernel for GeluTanhBackward {
    fn run<T: Float>(&self, args: &[&[T]]) -> candle_core::Result<Vec<T>> {
        Ok(args[0]
            .iter()
            .zip(args[1])
            .map(|(x, dy)| {
                let x = x.to_f64();
                let t = (SQRT_TWO_OVER_PI * x * (1.0 + CUBIC * x * x)).tanh();
                let slope = SQRT_TWO_OVER_PI * (1.0 + 3.0 * CUBIC * x * x);
                T::from_f64(dy.to_f64() * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * slope))
            })
            .collect())
    }
}

impl CustomOp2 for GeluTanhBackward {
    fn name(&self) -> &'static str {
        "gelu_tanh_backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let args = [Arg::new(s1, l1, "x"), Arg::new(s2, l2, "dy")];
        Ok((run_kernel(self, self.name(), &args)?, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        Ok((
            super::gelu_cuda::backward((s1, l1), (s2, l2))?,
            l1.shape().clone(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Against a five-point central difference of Candle's forward in f64 (error ~1e-13).
    #[test]
    fn gradient_matches_finite_differences() -> candle_core::Result<()> {
        let values = [-4.0f64, -1.3, -0.2, 0.0, 0.7, 2.5, 6.0];
        let x = Var::new(&values, &Device::Cpu)?;
        let grads = gelu_tanh(x.as_tensor())?.sum_all()?.backward()?;
        let analytic: Vec<f64> = grads
            .get(x.as_tensor())
            .expect("x has a gradient")
            .to_vec1()?;
        let f = |v: f64| -> f64 {
            let t = Tensor::new(&[v], &Device::Cpu).unwrap();
            gelu_tanh(&t).unwrap().to_vec1::<f64>().unwrap()[0]
        };
        let h = 1e-3;
        for (v, a) in values.iter().zip(analytic) {
            let numeric =
                (8.0 * (f(v + h) - f(v - h)) - (f(v + 2.0 * h) - f(v - 2.0 * h))) / (12.0 * h);
            assert!((numeric - a).abs() < 1e-11, "x = {v}: {a} vs {numeric}");
        }
        Ok(())
    }
}
