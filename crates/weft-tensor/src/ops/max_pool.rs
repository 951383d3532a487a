//! `max_pool2d`: 2-D max pooling with any kernel, stride and padding (padding counts as
//! `-inf`), differentiable; the gradient of each output goes to the first maximum of its
//! window in row-major order, as in PyTorch. CPU and CUDA f32/f64 tensors and CUDA bf16/f16
//! tensors use a custom op (kernels in `max_pool_cpu`, `kernels/max_pool.cu` and, channels-last,
//! `kernels/max_pool_nhwc.cu`); 16-bit CPU tensors are pooled in f32; others use Candle ops (see
//! [`max_pool2d_candle`]).

use super::channels_last::{is_channels_last, to_channels_last};
use super::max_pool_cpu::{PoolKernel, PoolPlanes, PoolWindow};
use super::storage::{half_on_cpu, run_kernel, uses_cpu_kernels, uses_cuda_kernels_with_half, Arg};
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp3, DType, Device, Layout, Result, Shape, Tensor,
};

/// Max pooling of `x` (`N x C x H x W`) over `kernel x kernel` windows with equal stride and
/// `-inf` padding on both spatial axes; returns `N x C x OH x OW` with
/// `OH = (H + 2 * padding - kernel) / stride + 1`. Requires `padding <= kernel / 2`.
pub fn max_pool2d(x: &Tensor, kernel: usize, stride: usize, padding: usize) -> Result<Tensor> {
    let window = PoolWindow::new(kernel, stride, padding);
    window.output_shape(x.dims())?;
    if half_on_cpu(&[x]) {
        let wide = max_pool2d(&x.to_dtype(DType::F32)?, kernel, stride, padding)?;
        return wide.to_dtype(x.dtype());
    }
    if uses_cpu_kernels(&[x]) || uses_cuda_kernels_with_half(&[x]) {
        x.contiguous()?.apply_op1(MaxPool2dOp { window })
    } else {
        max_pool2d_candle(x, kernel, stride, padding)
    }
}

/// [`max_pool2d`] without an autograd graph, for blocks with their own backward (see
/// [`max_pool2d_backward`]). The tensor must take weft's kernels.
pub fn max_pool2d_forward(
    x: &Tensor,
    kernel: usize,
    stride: usize,
    padding: usize,
) -> Result<Tensor> {
    let window = PoolWindow::new(kernel, stride, padding);
    window.output_shape(x.dims())?;
    #[cfg(feature = "cuda")]
    if let Some(y) = super::max_pool_nhwc::forward(x, window)? {
        return Ok(y);
    }
    let y = x.contiguous()?.apply_op1_no_bwd(&MaxPool2dOp { window })?;
    same_layout_as(x, y)
}

/// [`max_pool2d_forward`] and what [`max_pool2d_backward_saved`] needs of it: where the
/// channels-last kernels ran, each window's first maximum as a byte (U8, NHWC; then neither
/// `x`'s values nor the output need to be kept for the backward), elsewhere the output itself.
pub fn max_pool2d_forward_saving(
    x: &Tensor,
    kernel: usize,
    stride: usize,
    padding: usize,
) -> Result<(Tensor, Tensor)> {
    let window = PoolWindow::new(kernel, stride, padding);
    window.output_shape(x.dims())?;
    #[cfg(feature = "cuda")]
    if let Some(pooled) = super::max_pool_nhwc::forward_saving(x, window)? {
        return Ok(pooled);
    }
    let y = max_pool2d_forward(x, kernel, stride, padding)?;
    Ok((y.clone(), y))
}

/// The input gradient of [`max_pool2d_forward_saving`]`(x) = (y, saved)` given `dy`: from the
/// first maxima when `saved` holds them (U8), else `saved` is `y` and `x` is read again.
pub fn max_pool2d_backward_saved(
    x: &Tensor,
    saved: &Tensor,
    dy: &Tensor,
    kernel: usize,
    stride: usize,
    padding: usize,
) -> Result<Tensor> {
    if saved.dtype() != DType::U8 {
        return max_pool2d_backward(x, saved, dy, kernel, stride, padding);
    }
    #[cfg(feature = "cuda")]
    if let Some(dx) = super::max_pool_nhwc::backward_from_first(
        x,
        saved,
        dy,
        PoolWindow::new(kernel, stride, padding),
    )? {
        return Ok(dx);
    }
    bail!("max_pool2d: first maxima were saved for an input the channels-last kernels do not take")
}

/// `t` channels-last when `like` is (where the NHWC kernels do not apply, a channels-last input
/// is pooled as NCHW planes, copied in and its results out).
fn same_layout_as(like: &Tensor, t: Tensor) -> Result<Tensor> {
    match is_channels_last(like) {
        true => to_channels_last(&t),
        false => Ok(t),
    }
}

/// The input gradient of [`max_pool2d_forward`]`(x) = y` given `dy`.
pub fn max_pool2d_backward(
    x: &Tensor,
    y: &Tensor,
    dy: &Tensor,
    kernel: usize,
    stride: usize,
    padding: usize,
) -> Result<Tensor> {
    let window = PoolWindow::new(kernel, stride, padding);
    #[cfg(feature = "cuda")]
    if let Some(dx) = super::max_pool_nhwc::backward(x, y, dy, window)? {
        return Ok(dx);
    }
    let dx = x.contiguous()?.apply_op3_no_bwd(
        &y.contiguous()?,
        &dy.contiguous()?,
        &MaxPool2dBackward { window },
    )?;
    same_layout_as(x, dx)
}

/// The differentiable op: arg `x`.
struct MaxPool2dOp {
    window: PoolWindow,
}

/// Input gradient op: args `(x, y, dy)`.
struct MaxPool2dBackward {
    window: PoolWindow,
}

impl CustomOp1 for MaxPool2dOp {
    fn name(&self) -> &'static str {
        "weft-max-pool2d"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, c, out_h, out_w) = self.window.output_shape(layout.dims())?;
        let (_, _, h, w) = layout.shape().dims4()?;
        let kernel = PoolKernel::new(self.window, (h, w), (out_h, out_w), false);
        let arg = Arg {
            storage,
            layout,
            name: "x",
        };
        Ok((
            run_kernel(&kernel, self.name(), &[arg])?,
            (n, c, out_h, out_w).into(),
        ))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        let (n, c, out_h, out_w) = self.window.output_shape(layout.dims())?;
        let (_, _, h, w) = layout.shape().dims4()?;
        let planes = PoolPlanes {
            count: n * c,
            input: (h, w),
            output: (out_h, out_w),
        };
        let y = super::max_pool_cuda::run(self.window, planes, &[(storage, layout, "x")])?;
        Ok((y, (n, c, out_h, out_w).into()))
    }

    fn bwd(&self, x: &Tensor, y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        let w = self.window;
        Ok(Some(max_pool2d_backward(
            x, y, dy, w.kernel, w.stride, w.padding,
        )?))
    }
}

impl CustomOp3 for MaxPool2dBackward {
    fn name(&self) -> &'static str {
        "weft-max-pool2d-backward"
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
        let planes = self.check(l1, l2, l3)?;
        let kernel = PoolKernel::new(self.window, planes.input, planes.output, true);
        let args = [
            Arg {
                storage: s1,
                layout: l1,
                name: "x",
            },
            Arg {
                storage: s2,
                layout: l2,
                name: "y",
            },
            Arg {
                storage: s3,
                layout: l3,
                name: "dy",
            },
        ];
        Ok((run_kernel(&kernel, self.name(), &args)?, l1.shape().clone()))
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
        let planes = self.check(l1, l2, l3)?;
        let args = [(s1, l1, "x"), (s2, l2, "y"), (s3, l3, "dy")];
        let dx = super::max_pool_cuda::run(self.window, planes, &args)?;
        Ok((dx, l1.shape().clone()))
    }
}

impl MaxPool2dBackward {
    /// Checks that `y` and `dy` have the pooled shape of `x`.
    fn check(&self, x: &Layout, y: &Layout, dy: &Layout) -> Result<PoolPlanes> {
        let (n, c, out_h, out_w) = self.window.output_shape(x.dims())?;
        for (name, dims) in [("y", y.dims()), ("dy", dy.dims())] {
            if dims != [n, c, out_h, out_w] {
                bail!(
                    "weft-max-pool2d-backward: {name} has shape {dims:?}, expected {:?}",
                    (n, c, out_h, out_w)
                );
            }
        }
        let (_, _, h, w) = x.shape().dims4()?;
        Ok(PoolPlanes {
            count: n * c,
            input: (h, w),
            output: (out_h, out_w),
        })
    }
}

/// Max pooling from Candle ops, for devices and dtypes without the CPU kernel: a running
/// maximum over the `kernel^2` strided window offsets that keeps the first maximum, with
/// `-inf` padding. (Candle's own `max_pool2d` backward is not used: in candle-core 0.11.1
/// it scales gradients by the tie fraction instead of dividing by it, and misroutes them
/// when the input size is not a multiple of the kernel.)
pub(super) fn max_pool2d_candle(
    x: &Tensor,
    kernel: usize,
    stride: usize,
    padding: usize,
) -> Result<Tensor> {
    let window = PoolWindow::new(kernel, stride, padding);
    let (n, c, out_h, out_w) = window.output_shape(x.dims())?;
    let (_, _, h, w) = x.dims4()?;
    let padded_dims = (n, c, h + 2 * padding, w + 2 * padding);
    let inside = Tensor::ones((h, w), DType::U8, x.device())?
        .pad_with_zeros(0, padding, padding)?
        .pad_with_zeros(1, padding, padding)?
        .broadcast_as(padded_dims)?;
    let minus_inf = Tensor::new(f32::NEG_INFINITY, x.device())?
        .to_dtype(x.dtype())?
        .broadcast_as(padded_dims)?;
    let zero_padded = x
        .pad_with_zeros(2, padding, padding)?
        .pad_with_zeros(3, padding, padding)?;
    let padded = inside.where_cond(&zero_padded, &minus_inf)?;
    let offsets = |start: usize, count: usize, device: &Device| {
        let idx: Vec<u32> = (0..count).map(|o| (start + o * stride) as u32).collect();
        Tensor::new(idx, device)
    };
    let mut running_max: Option<Tensor> = None;
    for kr in 0..kernel {
        let rows = padded.index_select(&offsets(kr, out_h, x.device())?, 2)?;
        for kc in 0..kernel {
            let candidate = rows.index_select(&offsets(kc, out_w, x.device())?, 3)?;
            running_max = Some(match running_max {
                None => candidate,
                Some(best) => candidate.gt(&best)?.where_cond(&candidate, &best)?,
            });
        }
    }
    match running_max {
        Some(y) => Ok(y),
        None => bail!("max_pool2d: empty kernel"),
    }
}
