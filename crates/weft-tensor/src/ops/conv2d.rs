//! `conv2d`: 2-D convolution (NCHW input, OIHW weight, groups 1, dilation 1) as a Candle
//! custom op whose backward runs dedicated input- and weight-gradient kernels: the CPU
//! kernels, or cuDNN's for CUDA tensors (feature `cudnn`). Other tensors use Candle's own
//! `conv2d`.

use super::conv_cpu::{conv_backward_data, conv_backward_filter, conv_forward, ConvProblem};
#[cfg(feature = "cudnn")]
use super::conv_cudnn::{cudnn_conv, CudnnPass};
use super::im2col::ConvGeometry;
use super::storage::{
    dims4, half_on_cpu, run_kernel, uses_cpu_kernels, Arg, CpuKernel, Float, ANY_FLOAT,
};
#[cfg(feature = "cudnn")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};

use super::channels_last::is_channels_last;

/// 2-D convolution of `x` (`N x C_in x H x W`) with `w` (`C_out x C_in x KH x KW`), equal
/// stride and zero padding on both spatial axes; returns `N x C_out x OH x OW` with
/// `OH = (H + 2 * padding - KH) / stride + 1` (likewise `OW`). Differentiable.
pub fn conv2d(x: &Tensor, w: &Tensor, stride: usize, padding: usize) -> Result<Tensor> {
    conv_problem(x.dims(), w.dims(), stride, padding)?;
    if half_on_cpu(&[x, w]) {
        let wide = conv2d(
            &x.to_dtype(DType::F32)?,
            &w.to_dtype(DType::F32)?,
            stride,
            padding,
        )?;
        return wide.to_dtype(x.dtype());
    }
    if uses_cpu_kernels(&[x, w]) || uses_cudnn(&[x, w]) {
        x.contiguous()?
            .apply_op2(&w.contiguous()?, Conv2dOp { stride, padding })
    } else {
        x.conv2d(w, padding, stride, 1, 1)
    }
}

/// [`conv2d`] without an autograd graph, for blocks with their own backward (see
/// [`conv2d_backward`]). The tensors must take weft's kernels ([`super::has_kernels`]).
pub fn conv2d_forward(x: &Tensor, w: &Tensor, stride: usize, padding: usize) -> Result<Tensor> {
    let _problem = conv_problem(x.dims(), w.dims(), stride, padding)?;
    if !graph_free(&[x, w]) {
        bail!(
            "conv2d_forward: no weft kernel for {:?} tensors on {:?}",
            x.dtype(),
            x.device().location()
        );
    }
    #[cfg(feature = "cudnn")]
    if uses_nhwc(x) {
        return super::conv_nhwc::forward(x, w, _problem);
    }
    x.contiguous()?
        .apply_op2_no_bwd(&w.contiguous()?, &Conv2dOp { stride, padding })
}

/// [`conv2d_forward`] and its output's per-channel `[sum; sum of squares]` (`2 x C_out`, f32)
/// from the same cuDNN kernel, for the training-mode batch norm after it
/// ([`super::batch_norm_train_forward_from_sums`]): on channels-last bf16/f16 CUDA tensors
/// with the fusion on (`set_conv_stats`) and an engine for the shape; `None` otherwise.
pub fn conv2d_forward_with_sums(
    x: &Tensor,
    w: &Tensor,
    stride: usize,
    padding: usize,
) -> Result<Option<(Tensor, Tensor)>> {
    let _problem = conv_problem(x.dims(), w.dims(), stride, padding)?;
    #[cfg(feature = "cudnn")]
    if graph_free(&[x, w]) {
        return super::conv_stats::forward_with_sums(x, w, _problem);
    }
    Ok(None)
}

/// `w` in the layout the graph-free passes over input `x` read it in: on the channels-last
/// (NHWC) path a channels-last copy, which [`conv2d_forward`] and the input-gradient passes then
/// view without moving it (a 3 x 3 filter is transposed once for a forward and its backward,
/// not once for each); `w` itself elsewhere. Gradients stay keyed and shaped as `w`'s.
pub fn conv2d_filter_for(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cudnn")]
    if uses_nhwc(x) {
        return super::to_channels_last(w);
    }
    #[cfg(not(feature = "cudnn"))]
    let _ = x;
    Ok(w.clone())
}

/// The gradients of [`conv2d_forward`]`(x, w)` given the output gradient `dy`:
/// `(dx if input_grad, dw)`; `dw` is stored channels-last on the NHWC cuDNN path (see
/// `conv_nhwc::backward_filter`), contiguous otherwise.
pub fn conv2d_backward(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    stride: usize,
    padding: usize,
    input_grad: bool,
) -> Result<(Option<Tensor>, Tensor)> {
    let problem = conv_problem(x.dims(), w.dims(), stride, padding)?;
    problem.check_output_grad(dy.dims(), "conv2d_backward")?;
    let (dx, dw) = conv_grads(x, w, dy, stride, padding, (input_grad, true))?;
    Ok((dx, dw.expect("the weight gradient was asked for")))
}

/// The weight gradient of [`conv2d_forward`]`(x, w)` given `dy`.
pub(super) fn conv2d_backward_filter(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    stride: usize,
    padding: usize,
) -> Result<Tensor> {
    let (_, dw) = conv_grads(x, w, dy, stride, padding, (false, true))?;
    dw.ok_or_else(|| candle_core::Error::Msg("conv2d: no weight gradient".into()))
}

/// Input and weight gradients of a convolution, each only when `wanted`.
fn conv_grads(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    stride: usize,
    padding: usize,
    wanted: (bool, bool),
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    #[cfg(feature = "cudnn")]
    if uses_nhwc(x) {
        use super::conv_nhwc::{backward_data, backward_filter};
        let problem = conv_problem(x.dims(), w.dims(), stride, padding)?;
        let dx = wanted
            .0
            .then(|| backward_data(dy, w, problem, is_channels_last(x)))
            .transpose()?;
        let dw = wanted
            .1
            .then(|| backward_filter(x, dy, problem))
            .transpose()?;
        return Ok((dx, dw));
    }
    let (x, w, dy) = (&x.contiguous()?, &w.contiguous()?, &dy.contiguous()?);
    let (_, _, in_h, in_w) = x.dims4()?;
    let (_, _, k_h, k_w) = w.dims4()?;
    let dx = if wanted.0 {
        let op = Conv2dBackwardData {
            stride,
            padding,
            in_hw: (in_h, in_w),
        };
        Some(dy.apply_op2_no_bwd(w, &op)?)
    } else {
        None
    };
    let dw = if wanted.1 {
        let op = Conv2dBackwardFilter {
            stride,
            padding,
            kernel_hw: (k_h, k_w),
        };
        Some(x.apply_op2_no_bwd(dy, &op)?)
    } else {
        None
    };
    Ok((dx, dw))
}

/// Whether the tensors go to cuDNN: f32, f64, bf16 or f16 on a CUDA device, in a build with
/// `cudnn` (16-bit convolutions accumulate in f32).
pub(super) fn uses_cudnn(tensors: &[&Tensor]) -> bool {
    cfg!(feature = "cudnn")
        && tensors
            .iter()
            .all(|t| t.device().is_cuda() && ANY_FLOAT.contains(&t.dtype()))
}

static CONV_NHWC: AtomicBool = AtomicBool::new(false);

/// Runs the graph-free convolution passes of 16-bit CUDA tensors in NHWC memory order, their
/// operands copied in and out (off by default: on an H100 the copies cost more than NHWC saves
/// while the model's own tensors are NCHW; docs/history/2026-11.md). For measurements and checks.
pub fn set_conv_nhwc(on: bool) {
    CONV_NHWC.store(on, Ordering::Relaxed);
}

/// Whether the graph-free passes of `x` run through cuDNN in NHWC (`conv_nhwc`): `x` on a CUDA
/// device stored channels-last, or 16-bit after [`set_conv_nhwc`]`(true)`.
pub(super) fn uses_nhwc(x: &Tensor) -> bool {
    let half = matches!(x.dtype(), DType::BF16 | DType::F16);
    uses_cudnn(&[x]) && (is_channels_last(x) || (half && CONV_NHWC.load(Ordering::Relaxed)))
}

/// Whether the graph-free passes take the tensors: cuDNN's, or the CPU kernels (16-bit CPU
/// tensors computed in f32).
pub(super) fn graph_free(tensors: &[&Tensor]) -> bool {
    uses_cudnn(tensors) || uses_cpu_kernels(tensors) || half_on_cpu(tensors)
}

/// Validates the shapes of a convolution and derives its problem description.
pub(super) fn conv_problem(
    x_dims: &[usize],
    w_dims: &[usize],
    stride: usize,
    padding: usize,
) -> Result<ConvProblem> {
    let (batch, c_in, in_h, in_w) = dims4(x_dims, "conv2d", "x")?;
    let (c_out, w_c_in, k_h, k_w) = dims4(w_dims, "conv2d", "w")?;
    if stride == 0 {
        bail!("conv2d: stride must be positive");
    }
    if c_in == 0 || c_out == 0 || k_h == 0 || k_w == 0 {
        bail!("conv2d: x {x_dims:?} and w {w_dims:?} must have non-zero channels and kernel");
    }
    if w_c_in != c_in {
        bail!("conv2d: w has {w_c_in} input channels (shape {w_dims:?}) but x has {c_in} (shape {x_dims:?})");
    }
    let (padded_h, padded_w) = (in_h + 2 * padding, in_w + 2 * padding);
    if padded_h < k_h || padded_w < k_w {
        bail!("conv2d: kernel {k_h}x{k_w} is larger than the padded input {padded_h}x{padded_w}");
    }
    let geom = ConvGeometry {
        c_in,
        in_h,
        in_w,
        k_h,
        k_w,
        stride,
        padding,
        out_h: (padded_h - k_h) / stride + 1,
        out_w: (padded_w - k_w) / stride + 1,
    };
    Ok(ConvProblem { batch, c_out, geom })
}

/// The differentiable forward op on the CPU: args `(x, w)`.
struct Conv2dOp {
    stride: usize,
    padding: usize,
}

/// Input gradient op: args `(dy, w)`, result `dx` of spatial size `in_hw`.
struct Conv2dBackwardData {
    stride: usize,
    padding: usize,
    in_hw: (usize, usize),
}

/// Weight gradient op: args `(x, dy)`, result `dw` with kernel size `kernel_hw`.
struct Conv2dBackwardFilter {
    stride: usize,
    padding: usize,
    kernel_hw: (usize, usize),
}

impl ConvProblem {
    /// The output shape `N x C_out x OH x OW`.
    fn output_shape(&self) -> Shape {
        (self.batch, self.c_out, self.geom.out_h, self.geom.out_w).into()
    }

    /// Checks that an output gradient has this problem's output shape.
    pub(super) fn check_output_grad(&self, dy_dims: &[usize], op: &str) -> Result<()> {
        if dy_dims != self.output_shape().dims() {
            bail!(
                "{op}: output gradient has shape {dy_dims:?}, expected {:?}",
                self.output_shape().dims()
            );
        }
        Ok(())
    }
}

/// Which convolution kernel a custom op runs.
#[derive(Clone, Copy)]
enum ConvPass {
    Forward,
    BackwardData,
    BackwardFilter,
}

/// A convolution kernel bound to its problem, runnable on f32 or f64 slices.
struct ConvKernel {
    pass: ConvPass,
    problem: ConvProblem,
}

impl CpuKernel for ConvKernel {
    fn run<T: Float>(&self, args: &[&[T]]) -> Result<Vec<T>> {
        let &[a, b] = args else {
            bail!("conv2d kernel: expected 2 arguments, got {}", args.len());
        };
        let p = &self.problem;
        Ok(match self.pass {
            ConvPass::Forward => conv_forward(a, b, p),
            ConvPass::BackwardData => conv_backward_data(a, b, p),
            ConvPass::BackwardFilter => conv_backward_filter(a, b, p),
        })
    }
}

/// Runs one convolution pass on two CPU arguments.
fn run_conv(
    pass: ConvPass,
    problem: ConvProblem,
    op: &str,
    args: [(&CpuStorage, &Layout, &'static str); 2],
) -> Result<CpuStorage> {
    let args = args.map(|(storage, layout, name)| Arg {
        storage,
        layout,
        name,
    });
    run_kernel(&ConvKernel { pass, problem }, op, &args)
}

impl CustomOp2 for Conv2dOp {
    fn name(&self) -> &'static str {
        "weft-conv2d"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let problem = conv_problem(l1.dims(), l2.dims(), self.stride, self.padding)?;
        let storage = run_conv(
            ConvPass::Forward,
            problem,
            self.name(),
            [(s1, l1, "x"), (s2, l2, "w")],
        )?;
        Ok((storage, problem.output_shape()))
    }

    #[cfg(feature = "cudnn")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let problem = conv_problem(l1.dims(), l2.dims(), self.stride, self.padding)?;
        let shape = problem.output_shape();
        let storage = cudnn_conv(
            CudnnPass::Forward,
            (&problem, false),
            (s1, l1),
            (s2, l2),
            shape.elem_count(),
        )?;
        Ok((storage, shape))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let wanted = (x.track_op(), w.track_op());
        conv_grads(x, w, &dy.contiguous()?, self.stride, self.padding, wanted)
    }
}

impl CustomOp2 for Conv2dBackwardData {
    fn name(&self) -> &'static str {
        "weft-conv2d-backward-data"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (batch, _, _, _) = dims4(l1.dims(), self.name(), "dy")?;
        let (_, c_in, _, _) = dims4(l2.dims(), self.name(), "w")?;
        let (in_h, in_w) = self.in_hw;
        let problem = conv_problem(
            &[batch, c_in, in_h, in_w],
            l2.dims(),
            self.stride,
            self.padding,
        )?;
        problem.check_output_grad(l1.dims(), self.name())?;
        let storage = run_conv(
            ConvPass::BackwardData,
            problem,
            self.name(),
            [(s1, l1, "dy"), (s2, l2, "w")],
        )?;
        Ok((storage, (batch, c_in, in_h, in_w).into()))
    }

    #[cfg(feature = "cudnn")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (batch, _, _, _) = dims4(l1.dims(), self.name(), "dy")?;
        let (_, c_in, _, _) = dims4(l2.dims(), self.name(), "w")?;
        let (in_h, in_w) = self.in_hw;
        let problem = conv_problem(
            &[batch, c_in, in_h, in_w],
            l2.dims(),
            self.stride,
            self.padding,
        )?;
        problem.check_output_grad(l1.dims(), self.name())?;
        let shape: Shape = (batch, c_in, in_h, in_w).into();
        let storage = cudnn_conv(
            CudnnPass::BackwardData,
            (&problem, false),
            (s1, l1),
            (s2, l2),
            shape.elem_count(),
        )?;
        Ok((storage, shape))
    }
}

impl CustomOp2 for Conv2dBackwardFilter {
    fn name(&self) -> &'static str {
        "weft-conv2d-backward-filter"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, c_in, _, _) = dims4(l1.dims(), self.name(), "x")?;
        let (_, c_out, _, _) = dims4(l2.dims(), self.name(), "dy")?;
        let (k_h, k_w) = self.kernel_hw;
        let problem = conv_problem(
            l1.dims(),
            &[c_out, c_in, k_h, k_w],
            self.stride,
            self.padding,
        )?;
        problem.check_output_grad(l2.dims(), self.name())?;
        let storage = run_conv(
            ConvPass::BackwardFilter,
            problem,
            self.name(),
            [(s1, l1, "x"), (s2, l2, "dy")],
        )?;
        Ok((storage, (c_out, c_in, k_h, k_w).into()))
    }

    #[cfg(feature = "cudnn")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (_, c_in, _, _) = dims4(l1.dims(), self.name(), "x")?;
        let (_, c_out, _, _) = dims4(l2.dims(), self.name(), "dy")?;
        let (k_h, k_w) = self.kernel_hw;
        let problem = conv_problem(
            l1.dims(),
            &[c_out, c_in, k_h, k_w],
            self.stride,
            self.padding,
        )?;
        problem.check_output_grad(l2.dims(), self.name())?;
        let shape: Shape = (c_out, c_in, k_h, k_w).into();
        let storage = cudnn_conv(
            CudnnPass::BackwardFilter,
            (&problem, false),
            (s1, l1),
            (s2, l2),
            shape.elem_count(),
        )?;
        Ok((storage, shape))
    }
}
