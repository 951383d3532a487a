//! Convolutions through cuDNN in NHWC memory order (the filter in KRSC): for channels-last
//! tensors, whose NHWC storage cuDNN reads and writes directly (the results are channels-last
//! too), and, after `set_conv_nhwc(true)`, for 16-bit NCHW tensors, whose operands are copied
//! in and the results out (measured on an H100, those copies cost more than NHWC saves:
//! ResNet-50 bf16 956 against 1074 images/s with heuristic choices). Weight gradients come
//! back OIHW-shaped and stored channels-last, as cuDNN writes them. bf16 stride-2 convolutions
//! over at most four input channels (the stem) run lowered by space-to-depth
//! (`conv_space_to_depth`).

use candle_core::{bail, CpuStorage, CudaStorage, CustomOp2, Layout, Result, Shape, Tensor};

use super::channels_last::{from_nhwc, is_channels_last, nchw_from_nhwc, nhwc};
use super::conv_cpu::ConvProblem;
use super::conv_cudnn::{cudnn_conv, CudnnPass};
use super::conv_space_to_depth::SpaceToDepth;

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

/// One pass on `a` and `b` in NHWC; the result viewed channels-last when `channels_last`,
/// transposed into contiguous NCHW otherwise.
fn run(
    pass: CudnnPass,
    problem: ConvProblem,
    (a, b): (&Tensor, &Tensor),
    out: [usize; 4],
    channels_last: bool,
) -> Result<Tensor> {
    let op = NhwcPass {
        pass,
        problem,
        out: Shape::from(&out[..]),
    };
    let result = nhwc(a)?.apply_op2_no_bwd(&nhwc(b)?, &op)?;
    match channels_last {
        true => from_nhwc(&result),
        false => nchw_from_nhwc(&result),
    }
}

/// The convolution of `x` with `w`, in `x`'s layout.
pub(super) fn forward(x: &Tensor, w: &Tensor, problem: ConvProblem) -> Result<Tensor> {
    if let Some(lowering) = SpaceToDepth::for_problem(&problem, x.dtype()) {
        let y = forward(
            &lowering.input(x)?,
            &lowering.filter(w)?,
            lowering.lowered()?,
        )?;
        return match is_channels_last(x) {
            true => Ok(y),
            false => y.contiguous(),
        };
    }
    let g = &problem.geom;
    let out = [problem.batch, g.out_h, g.out_w, problem.c_out];
    run(
        CudnnPass::Forward,
        problem,
        (x, w),
        out,
        is_channels_last(x),
    )
}

/// The input gradient from `dy` and `w`, channels-last when `channels_last` (the input was).
pub(super) fn backward_data(
    dy: &Tensor,
    w: &Tensor,
    problem: ConvProblem,
    channels_last: bool,
) -> Result<Tensor> {
    if let Some(lowering) = SpaceToDepth::for_problem(&problem, dy.dtype()) {
        let blocks_grad = backward_data(dy, &lowering.filter(w)?, lowering.lowered()?, true)?;
        return lowering.input_grad(&blocks_grad, channels_last);
    }
    let g = &problem.geom;
    let out = [problem.batch, g.in_h, g.in_w, g.c_in];
    run(
        CudnnPass::BackwardData,
        problem,
        (dy, w),
        out,
        channels_last,
    )
}

/// The weight gradient from `x` and `dy`: OIHW-shaped, stored channels-last (KRSC, as cuDNN
/// wrote it). The copy that writes it into a flat gradient buffer transposes it
/// (`copy_tensors`), so no pass of its own does.
pub(super) fn backward_filter(x: &Tensor, dy: &Tensor, problem: ConvProblem) -> Result<Tensor> {
    if let Some(lowering) = SpaceToDepth::for_problem(&problem, x.dtype()) {
        let blocks_grad = backward_filter(&lowering.input(x)?, dy, lowering.lowered()?)?;
        return lowering.filter_grad(&blocks_grad);
    }
    let g = &problem.geom;
    let out = [problem.c_out, g.k_h, g.k_w, g.c_in];
    run(CudnnPass::BackwardFilter, problem, (x, dy), out, true)
}
