//! `conv2d_backward_add`: a convolution's backward whose input gradient is added in place into
//! an existing tensor (`acc += dx`) instead of being returned, so the two gradients that meet at
//! a residual block's input (shortcut and branch) need no separate addition: on CUDA one cuDNN
//! backward-data launch with beta = 1, on the CPU the input-gradient kernel then one pass of adds.

use super::channels_last::is_channels_last;
use super::conv2d::{conv2d_backward_filter, conv_problem, graph_free, uses_nhwc};
use super::conv_cpu::{conv_backward_data, ConvProblem};
#[cfg(feature = "cudnn")]
use super::conv_cudnn::cudnn_conv_backward_data_add;
use super::storage::{dims4, widened, Arg, Float};
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
    if !(acc.is_contiguous() || (uses_nhwc(acc) && is_channels_last(acc))) {
        bail!("conv2d_backward_add: the tensor added into must be contiguous (or channels-last on a GPU)");
    }
    if !graph_free(&[acc, w, dy]) {
        bail!(
            "conv2d_backward_add: no weft kernel for {:?} tensors on {:?}",
            acc.dtype(),
            acc.device().location()
        );
    }
    match uses_nhwc(acc) {
        // cuDNN adds in NHWC: into a channels-last `acc`'s own storage (its NHWC view), or
        // into a copy of an NCHW `acc`, copied back.
        #[cfg(feature = "cudnn")]
        true => {
            use super::channels_last::{from_nhwc, nhwc};
            let acc_nhwc = nhwc(acc)?;
            let op = AddBackwardData {
                problem,
                nhwc: true,
            };
            acc_nhwc.inplace_op3(&nhwc(dy)?, &nhwc(w)?, &op)?;
            if !is_channels_last(acc) {
                super::copy_tensors(&[(&from_nhwc(&acc_nhwc)?.contiguous()?, acc)])?;
            }
        }
        _ => {
            let op = AddBackwardData {
                problem,
                nhwc: false,
            };
            acc.inplace_op3(&dy.contiguous()?, &w.contiguous()?, &op)?;
        }
    }
    conv2d_backward_filter(x, w, dy, stride, padding)
}

/// In-place op on `(acc, dy, w)`: `acc += dx`.
struct AddBackwardData {
    problem: ConvProblem,
    /// Operands in NHWC memory order (the filter in KRSC), as cuDNN's NHWC plans take them.
    nhwc: bool,
}

/// The NCHW dimensions of an operand given in NHWC order when `nhwc`.
fn logical(dims: &[usize], nhwc: bool) -> Vec<usize> {
    match (nhwc, dims) {
        (true, &[n, h, w, c]) => vec![n, c, h, w],
        _ => dims.to_vec(),
    }
}

impl AddBackwardData {
    fn check(&self, acc: &Layout, dy: &Layout, w: &Layout) -> Result<()> {
        let name = self.name();
        let (batch, c_in, in_h, in_w) = dims4(&logical(acc.dims(), self.nhwc), name, "acc")?;
        let g = &self.problem.geom;
        if (batch, c_in, in_h, in_w) != (self.problem.batch, g.c_in, g.in_h, g.in_w) {
            bail!("{name}: the tensor added into has shape {:?}", acc.dims());
        }
        self.problem
            .check_output_grad(&logical(dy.dims(), self.nhwc), name)?;
        dims4(w.dims(), name, "w")?;
        Ok(())
    }

    /// The input gradient of 16-bit `dy` and `w`, computed in f32.
    fn half_input_gradient(
        &self,
        dy: (&CpuStorage, &Layout),
        w: (&CpuStorage, &Layout),
    ) -> Result<Vec<f32>> {
        let name = self.name();
        let dy = widened(name, &Arg::new(dy.0, dy.1, "dy"))?;
        let w = widened(name, &Arg::new(w.0, w.1, "w"))?;
        Ok(conv_backward_data(&dy, &w, &self.problem))
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
            CpuStorage::BF16(acc) => {
                let dx = self.half_input_gradient((dy, dy_l), (w, w_l))?;
                for (a, d) in acc[start..end].iter_mut().zip(dx) {
                    *a = half::bf16::from_f32(a.to_f32() + d);
                }
            }
            CpuStorage::F16(acc) => {
                let dx = self.half_input_gradient((dy, dy_l), (w, w_l))?;
                for (a, d) in acc[start..end].iter_mut().zip(dx) {
                    *a = half::f16::from_f32(a.to_f32() + d);
                }
            }
            other => bail!(
                "conv2d_backward_add: dtype {:?} is not supported",
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
        cudnn_conv_backward_data_add(
            (&self.problem, self.nhwc),
            (acc, acc_l),
            (dy, dy_l),
            (w, w_l),
        )
    }
}
