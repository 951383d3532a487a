//! `conv2d_backward_add`: a convolution's backward whose input gradient is added in place into
//! an existing tensor (`acc += dx`) instead of being returned, so the two gradients that meet at
//! a residual block's input (shortcut and branch) need no separate addition: on CUDA one cuDNN
//! backward-data launch with beta = 1, on the CPU the input-gradient kernel then one pass of adds.

use super::conv2d::{conv2d_backward_filter, conv_problem, uses_cudnn};
use super::conv_cpu::{conv_backward_data, ConvProblem};
#[cfg(feature = "cudnn")]
use super::conv_cudnn::cudnn_conv_backward_data_add;
use super::storage::{dims4, uses_cpu_kernels, Float};
use candle_core::backend::BackendStorage;
#[cfg(feature = "cudnn")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, InplaceOp3, Layout, Result, Tensor, WithDType};

/// The gradients of [`super::conv2d_forward`]`(x, w)` given the output gradient `dy`, with the
/// input gradient added into `acc` (a contiguous tensor of `x`'s shape, dtype and device);
/// returns the weight gradient. `acc`'s storage is written in place: every tensor sharing it
/// (its clones) sees the sum, so no one may still need its old values.
pub fn conv2d_backward_add(
    acc: &Tensor,
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    stride: usize,
    padding: usize,
) -> Result<Tensor> {
    let problem = conv_problem(x.dims(), w.dims(), stride, padding)?;
    problem.check_output_grad(dy.dims(), "conv2d_backward_add")?;
    if acc.dims() != x.dims() || acc.dtype() != x.dtype() {
        bail!(
            "conv2d_backward_add: the tensor added into is {:?} {:?}, expected x's {:?} {:?}",
            acc.dtype(),
            acc.dims(),
            x.dtype(),
            x.dims()
        );
    }
    if !acc.is_contiguous() {
        bail!("conv2d_backward_add: the tensor added into must be contiguous");
    }
    if !(uses_cpu_kernels(&[acc, w, dy]) || uses_cudnn(&[acc, w, dy])) {
        bail!(
            "conv2d_backward_add: no weft kernel for {:?} tensors on {:?}",
            acc.dtype(),
            acc.device().location()
        );
    }
    let dy = dy.contiguous()?;
    acc.inplace_op3(&dy, &w.contiguous()?, &AddBackwardData { problem })?;
    conv2d_backward_filter(x, w, &dy, stride, padding)
}

/// In-place op on `(acc, dy, w)`: `acc += dx`.
struct AddBackwardData {
    problem: ConvProblem,
}

impl AddBackwardData {
    fn check(&self, acc: &Layout, dy: &Layout, w: &Layout) -> Result<()> {
        let name = self.name();
        let (batch, c_in, in_h, in_w) = dims4(acc.dims(), name, "acc")?;
        let g = &self.problem.geom;
        if (batch, c_in, in_h, in_w) != (self.problem.batch, g.c_in, g.in_h, g.in_w) {
            bail!("{name}: the tensor added into has shape {:?}", acc.dims());
        }
        self.problem.check_output_grad(dy.dims(), name)?;
        dims4(w.dims(), name, "w")?;
        Ok(())
    }
}

/// `acc[range] += conv_backward_data(dy, w)`.
fn add_into<T: Float + std::ops::AddAssign>(
    acc: &mut [T],
    dy: &[T],
    w: &[T],
    problem: &ConvProblem,
) {
    for (a, d) in acc.iter_mut().zip(conv_backward_data(dy, w, problem)) {
        *a += d;
    }
}

fn contiguous<'a, T: WithDType>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [T]> {
    let Some((start, end)) = l.contiguous_offsets() else {
        bail!("conv2d_backward_add: `{what}` must be contiguous");
    };
    Ok(&T::cpu_storage_as_slice(s)?[start..end])
}

impl InplaceOp3 for AddBackwardData {
    fn name(&self) -> &'static str {
        "weft-conv2d-backward-data-add"
    }

    fn cpu_fwd(
        &self,
        acc: &mut CpuStorage,
        acc_l: &Layout,
        dy: &CpuStorage,
        dy_l: &Layout,
        w: &CpuStorage,
        w_l: &Layout,
    ) -> Result<()> {
        self.check(acc_l, dy_l, w_l)?;
        let Some((start, end)) = acc_l.contiguous_offsets() else {
            bail!("conv2d_backward_add: the tensor added into must be contiguous");
        };
        match acc {
            CpuStorage::F32(acc) => add_into(
                &mut acc[start..end],
                contiguous(dy, dy_l, "dy")?,
                contiguous(w, w_l, "w")?,
                &self.problem,
            ),
            CpuStorage::F64(acc) => add_into(
                &mut acc[start..end],
                contiguous(dy, dy_l, "dy")?,
                contiguous(w, w_l, "w")?,
                &self.problem,
            ),
            other => bail!(
                "conv2d_backward_add: dtype {:?} is not supported (f32, f64)",
                other.dtype()
            ),
        }
        Ok(())
    }

    #[cfg(feature = "cudnn")]
    fn cuda_fwd(
        &self,
        acc: &mut CudaStorage,
        acc_l: &Layout,
        dy: &CudaStorage,
        dy_l: &Layout,
        w: &CudaStorage,
        w_l: &Layout,
    ) -> Result<()> {
        self.check(acc_l, dy_l, w_l)?;
        cudnn_conv_backward_data_add(&self.problem, (acc, acc_l), (dy, dy_l), (w, w_l))
    }
}
