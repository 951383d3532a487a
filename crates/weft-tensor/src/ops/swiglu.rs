//! SwiGLU, the gated MLP activation of the Llama family: `silu(gate) · up`,
//! `silu(g) = g σ(g)`, with its exact gradients `d_gate = dy · up · σ(g) (1 + g (1 − σ(g)))`
//! and `d_up = dy · silu(g)`, each in one pass.
//!
//! The CPU computes in f64 (16-bit values in f32, each result rounded once); CUDA f32, bf16
//! and f16 tensors run `kernels/swiglu.cu` (f32 inside); CUDA f64 takes [`swiglu_reference`],
//! Candle's ops.

use candle_core::backend::BackendStorage;
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor};

use super::storage::{run_kernel, uses_kernels_with_half, Arg, CpuKernel, Float};

/// Whether the fused op applies: float tensors of one type on the CPU, or f32/bf16/f16 ones
/// on CUDA with weft's kernels.
fn fused(tensors: &[&Tensor]) -> bool {
    let dtype = tensors[0].dtype();
    let one_type = tensors.iter().all(|t| t.dtype() == dtype);
    let cpu = tensors.iter().all(|t| t.device().is_cpu());
    one_type && uses_kernels_with_half(tensors) && (cpu || dtype != DType::F64)
}

/// `silu(gate) · up` for `gate` and `up` of one shape, differentiable.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if gate.shape() != up.shape() {
        bail!(
            "swiglu: gate {:?} and up {:?} differ",
            gate.dims(),
            up.dims()
        );
    }
    if !fused(&[gate, up]) {
        return swiglu_reference(gate, up);
    }
    gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu)
}

/// The gradients `(d_gate, d_up)` of [`swiglu`] from the output's gradient `dy`, without an
/// autograd graph.
pub fn swiglu_backward(gate: &Tensor, up: &Tensor, dy: &Tensor) -> Result<(Tensor, Tensor)> {
    if gate.shape() != up.shape() || gate.shape() != dy.shape() {
        bail!(
            "swiglu_backward: gate {:?}, up {:?} and dy {:?} differ",
            gate.dims(),
            up.dims(),
            dy.dims()
        );
    }
    if !fused(&[gate, up, dy]) {
        return swiglu_backward_reference(gate, up, dy);
    }
    let both = gate.contiguous()?.apply_op3_no_bwd(
        &up.contiguous()?,
        &dy.contiguous()?,
        &SwiGluBackward,
    )?;
    Ok((both.get(0)?, both.get(1)?))
}

/// [`swiglu_backward`] through Candle's ops.
pub(super) fn swiglu_backward_reference(
    gate: &Tensor,
    up: &Tensor,
    dy: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let sigmoid = (gate.neg()?.exp()? + 1.0)?.recip()?;
    let silu = (gate * &sigmoid)?;
    let slope = (&sigmoid * ((gate * (1.0 - &sigmoid)?)? + 1.0)?)?;
    Ok(((dy * up)?.mul(&slope)?, (dy * silu)?))
}

/// The same through Candle's ops.
pub fn swiglu_reference(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.silu()? * up
}

struct SwiGlu;

struct SwiGluKernel;

impl CpuKernel for SwiGluKernel {
    fn run<T: Float>(&self, args: &[&[T]]) -> Result<Vec<T>> {
        Ok(args[0]
            .iter()
            .zip(args[1])
            .map(|(g, u)| {
                let g = g.to_f64();
                T::from_f64(g / (1.0 + (-g).exp()) * u.to_f64())
            })
            .collect())
    }
}

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let args = [Arg::new(s1, l1, "gate"), Arg::new(s2, l2, "up")];
        Ok((
            run_kernel(&SwiGluKernel, self.name(), &args)?,
            l1.shape().clone(),
        ))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let y = super::swiglu_cuda::forward((s1, l1), (s2, l2))?;
        Ok((y, l1.shape().clone()))
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (d_gate, d_up) = swiglu_backward(gate, up, dy)?;
        Ok((Some(d_gate), Some(d_up)))
    }
}

/// `(gate, up, dy) → [d_gate | d_up]`, shape `[2, ..]`.
struct SwiGluBackward;

struct SwiGluBackwardKernel;

impl CpuKernel for SwiGluBackwardKernel {
    fn run<T: Float>(&self, args: &[&[T]]) -> Result<Vec<T>> {
        let n = args[0].len();
        let mut out = vec![T::ZERO; 2 * n];
        for i in 0..n {
            let (g, u, d) = (
                args[0][i].to_f64(),
                args[1][i].to_f64(),
                args[2][i].to_f64(),
            );
            let s = 1.0 / (1.0 + (-g).exp());
            out[i] = T::from_f64(d * u * s * (1.0 + g * (1.0 - s)));
            out[n + i] = T::from_f64(d * g * s);
        }
        Ok(out)
    }
}

impl SwiGluBackward {
    fn shape(layout: &Layout) -> Shape {
        let mut dims = vec![2];
        dims.extend_from_slice(layout.dims());
        dims.into()
    }
}

impl CustomOp3 for SwiGluBackward {
    fn name(&self) -> &'static str {
        "swiglu_backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let args = [
            Arg::new(s1, l1, "gate"),
            Arg::new(s2, l2, "up"),
            Arg::new(s3, l3, "dy"),
        ];
        let out = run_kernel(&SwiGluBackwardKernel, self.name(), &args)?;
        if out.dtype() != s1.dtype() {
            bail!("swiglu_backward: {:?} out of {:?}", out.dtype(), s1.dtype());
        }
        Ok((out, Self::shape(l1)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let out = super::swiglu_cuda::backward((s1, l1), (s2, l2), (s3, l3))?;
        Ok((out, Self::shape(l1)))
    }
}
