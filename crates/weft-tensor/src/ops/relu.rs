//! ReLU as custom ops whose backward is one pass, `dx = y <= 0 ? 0 : dy` over the output `y`
//! (Candle's own ReLU backward allocates and runs four full-size tensors and kernels):
//! [`relu`], and [`add_relu`], the `relu(a + b)` that ends every residual block, fused. On
//! CPU and CUDA f32, f64, bf16 and f16 tensors they run weft's kernels (CUDA:
//! `kernels/relu.cu`; 16-bit sums in f32); elsewhere Candle's ops. NaN stays NaN, and the gradient at exactly zero is zero, as in PyTorch.

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::channels_last::in_layout_of;
use super::storage::{run_kernel, uses_kernels_with_half, Arg, CpuKernel, Float};

/// `max(x, 0)`, differentiable.
pub fn relu(x: &Tensor) -> Result<Tensor> {
    if uses_kernels_with_half(&[x]) {
        x.contiguous()?.apply_op1(ReluOp::Forward)
    } else {
        x.relu()
    }
}

/// `max(a + b, 0)` for tensors of one shape, differentiable in both.
pub fn add_relu(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.shape() != b.shape() {
        bail!("add_relu: shapes {:?} and {:?} differ", a.dims(), b.dims());
    }
    if uses_kernels_with_half(&[a, b]) {
        a.contiguous()?
            .apply_op2(&b.contiguous()?, ReluOp::AddForward)
    } else {
        (a + b)?.relu()
    }
}

/// [`add_relu`] without an autograd graph, for blocks with their own backward (its backward
/// is [`relu_backward`] for both inputs). The tensors must take weft's kernels. The result is
/// channels-last when `a` is.
pub fn add_relu_forward(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    in_layout_of(a, &[b], |a, b| {
        a.apply_op2_no_bwd(&b[0], &ReluOp::AddForward)
    })
}

/// The gradient through a ReLU from its output `y` and the output's gradient `dy`
/// (not differentiable itself). Tensors must take weft's kernels (see [`relu`]). The result
/// is channels-last when `y` is.
pub fn relu_backward(y: &Tensor, dy: &Tensor) -> Result<Tensor> {
    in_layout_of(y, &[dy], |y, dy| {
        y.apply_op2_no_bwd(&dy[0], &ReluOp::Backward)
    })
}

/// The three ReLU kernels.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ReluOp {
    /// `(x) -> max(x, 0)`.
    Forward,
    /// `(a, b) -> max(a + b, 0)`.
    AddForward,
    /// `(y, dy) -> y <= 0 ? 0 : dy`.
    Backward,
}

impl ReluOp {
    pub(crate) fn kernel_name(self) -> &'static str {
        match self {
            ReluOp::Forward => "relu_forward",
            ReluOp::AddForward => "add_relu_forward",
            ReluOp::Backward => "relu_backward",
        }
    }

    fn args(self) -> [&'static str; 2] {
        match self {
            ReluOp::Forward => ["x", "x"],
            ReluOp::AddForward => ["a", "b"],
            ReluOp::Backward => ["y", "dy"],
        }
    }
}

fn relu_of<T: Float>(v: T) -> T {
    if v < T::ZERO {
        T::ZERO
    } else {
        v
    }
}

impl CpuKernel for ReluOp {
    fn run<T: Float>(&self, args: &[&[T]]) -> Result<Vec<T>> {
        let mut out = vec![T::ZERO; args[0].len()];
        const CHUNK: usize = 1 << 14;
        match (self, args) {
            (ReluOp::Forward, &[x]) => out
                .par_chunks_mut(CHUNK)
                .zip(x.par_chunks(CHUNK))
                .for_each(|(o, x)| o.iter_mut().zip(x).for_each(|(o, &x)| *o = relu_of(x))),
            (ReluOp::AddForward, &[a, b]) => out
                .par_chunks_mut(CHUNK)
                .zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK)))
                .for_each(|(o, (a, b))| {
                    for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
                        *o = relu_of(a + b);
                    }
                }),
            (ReluOp::Backward, &[y, dy]) => out
                .par_chunks_mut(CHUNK)
                .zip(y.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK)))
                .for_each(|(o, (y, dy))| {
                    for ((o, &y), &g) in o.iter_mut().zip(y).zip(dy) {
                        *o = if y <= T::ZERO { T::ZERO } else { g };
                    }
                }),
            (op, _) => bail!("{op:?}: wrong argument count {}", args.len()),
        }
        Ok(out)
    }
}

impl ReluOp {
    /// The two arguments of a binary pass must have one shape.
    fn same_shapes(&self, l1: &Layout, l2: &Layout) -> Result<()> {
        if l1.shape() != l2.shape() {
            bail!(
                "{}: shapes {:?} and {:?} differ",
                self.kernel_name(),
                l1.dims(),
                l2.dims()
            );
        }
        Ok(())
    }

    fn cpu(&self, args: &[(&CpuStorage, &Layout)]) -> Result<(CpuStorage, Shape)> {
        let names = self.args();
        let args: Vec<Arg<'_>> = args
            .iter()
            .zip(names)
            .map(|(&(storage, layout), name)| Arg {
                storage,
                layout,
                name,
            })
            .collect();
        let shape = args[0].layout.shape().clone();
        Ok((run_kernel(self, self.kernel_name(), &args)?, shape))
    }
}

impl CustomOp1 for ReluOp {
    fn name(&self) -> &'static str {
        "weft-relu"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        self.cpu(&[(storage, layout)])
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        super::relu_cuda::run(*self, &[(storage, layout)])
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(relu_backward(y, dy)?))
    }
}

impl CustomOp2 for ReluOp {
    fn name(&self) -> &'static str {
        match self {
            ReluOp::Backward => "weft-relu-backward",
            _ => "weft-add-relu",
        }
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.same_shapes(l1, l2)?;
        self.cpu(&[(s1, l1), (s2, l2)])
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.same_shapes(l1, l2)?;
        super::relu_cuda::run(*self, &[(s1, l1), (s2, l2)])
    }

    fn bwd(
        &self,
        _a: &Tensor,
        _b: &Tensor,
        y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = relu_backward(y, dy)?;
        Ok((Some(g.clone()), Some(g)))
    }
}
