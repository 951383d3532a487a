//! Max pooling of channels-last CUDA tensors on their NHWC storage (`kernels/max_pool.cu`'s
//! `_nhwc` kernels), with the rules of [`super::max_pool2d`]: no copies into NCHW planes and
//! back around the kernels. Applies to channels-last tensors on a GPU whose element counts fit
//! the kernels' 32-bit indices, with windows up to 15x15; [`forward`] and [`backward`] say
//! `None` otherwise. Built with
//! the `cuda` feature only.

use candle_core::{
    bail, CpuStorage, CudaStorage, CustomOp1, CustomOp3, Layout, Result, Shape, Tensor,
};

use super::channels_last::{from_nhwc, is_channels_last, nhwc};
use super::max_pool_cpu::PoolWindow;

/// `y = max_pool(x)` on the NHWC storage of a channels-last `x`, viewed channels-last.
pub(super) fn forward(x: &Tensor, window: PoolWindow) -> Result<Option<Tensor>> {
    if !applies(x, window) {
        return Ok(None);
    }
    let y = nhwc(x)?.apply_op1_no_bwd(&PoolNhwc { window })?;
    Ok(Some(from_nhwc(&y)?))
}

/// The input gradient of [`forward`]`(x) = y` given `dy`, viewed channels-last.
pub(super) fn backward(
    x: &Tensor,
    y: &Tensor,
    dy: &Tensor,
    window: PoolWindow,
) -> Result<Option<Tensor>> {
    if !applies(x, window) {
        return Ok(None);
    }
    let dx = nhwc(x)?.apply_op3_no_bwd(&nhwc(y)?, &nhwc(dy)?, &PoolNhwcBackward { window })?;
    Ok(Some(from_nhwc(&dx)?))
}

/// Channels-last on a GPU, element counts within 32 bits, and windows whose positions fit the
/// backward's byte (at most 15x15).
fn applies(x: &Tensor, window: PoolWindow) -> bool {
    x.device().is_cuda()
        && is_channels_last(x)
        && x.elem_count() <= u32::MAX as usize
        && window.kernel <= 15
}

/// The NCHW dims of NHWC `dims` and the pooled NHWC shape.
fn shapes(window: PoolWindow, dims: &[usize]) -> Result<([usize; 4], Shape)> {
    let &[n, h, w, c] = dims else {
        bail!("max_pool2d (NHWC): x has shape {dims:?}, expected 4 dims");
    };
    let (_, _, oh, ow) = window.output_shape(&[n, c, h, w])?;
    Ok(([n, c, h, w], Shape::from((n, oh, ow, c))))
}

/// The forward pass: arg `x` (NHWC).
struct PoolNhwc {
    window: PoolWindow,
}

/// The input gradient: args `(x, y, dy)` (NHWC).
struct PoolNhwcBackward {
    window: PoolWindow,
}

impl CustomOp1 for PoolNhwc {
    fn name(&self) -> &'static str {
        "weft-max-pool2d-nhwc"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        bail!("max_pool2d (NHWC): CUDA tensors only")
    }

    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        let (nchw, out) = shapes(self.window, layout.dims())?;
        let y = super::max_pool_cuda::run_nhwc(self.window, nchw, &[(storage, layout, "x")])?;
        Ok((y, out))
    }
}

impl CustomOp3 for PoolNhwcBackward {
    fn name(&self) -> &'static str {
        "weft-max-pool2d-nhwc-backward"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("max_pool2d (NHWC): CUDA tensors only")
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (nchw, out) = shapes(self.window, l1.dims())?;
        for (name, layout) in [("y", l2), ("dy", l3)] {
            if layout.shape() != &out {
                bail!(
                    "weft-max-pool2d-nhwc-backward: {name} has shape {:?}, expected {:?}",
                    layout.dims(),
                    out.dims()
                );
            }
        }
        let args = [(s1, l1, "x"), (s2, l2, "y"), (s3, l3, "dy")];
        let dx = super::max_pool_cuda::run_nhwc(self.window, nchw, &args)?;
        Ok((dx, l1.shape().clone()))
    }
}
