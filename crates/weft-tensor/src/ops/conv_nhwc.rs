//! Convolutions of 16-bit CUDA tensors through cuDNN in NHWC memory order (`set_conv_nhwc`).
//! The model's tensors stay NCHW: each pass copies its operands into NHWC (the filter into
//! KRSC), runs cuDNN, and copies the result back. Measured on an H100 these copies cost more
//! than NHWC saves (ResNet-50 bf16: 956 against 1074 images/s with heuristic choices), so it is
//! off by default; it is the convolution half of a channels-last model, whose tensors would
//! need no copies.

use candle_core::{bail, CpuStorage, CudaStorage, CustomOp2, Layout, Result, Shape, Tensor};

use super::conv_cpu::ConvProblem;
use super::conv_cudnn::{cudnn_conv, CudnnPass};

/// `t` (`N x C x H x W`) copied into NHWC order (`N x H x W x C`, contiguous).
pub(super) fn to_nhwc(t: &Tensor) -> Result<Tensor> {
    t.permute((0, 2, 3, 1))?.contiguous()
}

/// `t` (`N x H x W x C`) copied back into NCHW order.
pub(super) fn from_nhwc(t: &Tensor) -> Result<Tensor> {
    t.permute((0, 3, 1, 2))?.contiguous()
}

/// One cuDNN pass on NHWC operands; the result has NHWC shape `out`.
struct NhwcPass {
    pass: CudnnPass,
    problem: ConvProblem,
    out: Shape,
}

impl CustomOp2 for NhwcPass {
    fn name(&self) -> &'static str {
        "weft-conv2d-nhwc"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("conv2d in NHWC: CUDA tensors only")
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let storage = cudnn_conv(
            self.pass,
            (&self.problem, true),
            (s1, l1),
            (s2, l2),
            self.out.elem_count(),
        )?;
        Ok((storage, self.out.clone()))
    }
}

fn run(
    pass: CudnnPass,
    problem: ConvProblem,
    a: &Tensor,
    b: &Tensor,
    out: [usize; 4],
) -> Result<Tensor> {
    let op = NhwcPass {
        pass,
        problem,
        out: Shape::from(&out[..]),
    };
    from_nhwc(&to_nhwc(a)?.apply_op2_no_bwd(&to_nhwc(b)?, &op)?)
}

/// The convolution of `x` with `w` (NCHW in and out).
pub(super) fn forward(x: &Tensor, w: &Tensor, problem: ConvProblem) -> Result<Tensor> {
    let g = &problem.geom;
    let out = [problem.batch, g.out_h, g.out_w, problem.c_out];
    run(CudnnPass::Forward, problem, x, w, out)
}

/// The input gradient from `dy` and `w`.
pub(super) fn backward_data(dy: &Tensor, w: &Tensor, problem: ConvProblem) -> Result<Tensor> {
    let g = &problem.geom;
    let out = [problem.batch, g.in_h, g.in_w, g.c_in];
    run(CudnnPass::BackwardData, problem, dy, w, out)
}

/// The weight gradient from `x` and `dy` (OIHW).
pub(super) fn backward_filter(x: &Tensor, dy: &Tensor, problem: ConvProblem) -> Result<Tensor> {
    let g = &problem.geom;
    let out = [problem.c_out, g.k_h, g.k_w, g.c_in];
    run(CudnnPass::BackwardFilter, problem, x, dy, out)
}
