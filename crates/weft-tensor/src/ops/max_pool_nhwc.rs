//! Max pooling of channels-last CUDA tensors on their NHWC storage (`kernels/max_pool_nhwc.cu`),
//! with the rules of [`super::max_pool2d`]: no copies into NCHW planes and back around the
//! kernels. The forward can keep each window's first maximum as a byte, from
//! which the backward gathers the gradients without reading `x` and `y` again. Applies to
//! channels-last tensors on a GPU whose element counts fit the kernels' 32-bit indices, with
//! windows up to 15x15; the functions say `None` otherwise. Built with the `cuda` feature only.

use candle_core::op::BackpropOp;
use candle_core::{bail, CpuStorage, CustomOp3, DType, Layout, Result, Shape, Storage, Tensor};

use super::channels_last::{from_nhwc, is_channels_last, nhwc};
use super::max_pool_cpu::PoolWindow;
use super::max_pool_nhwc_cuda::{run_backward, run_backward_from_first, run_forward};

/// `y = max_pool(x)` on the NHWC storage of a channels-last `x`, viewed channels-last.
pub(super) fn forward(x: &Tensor, window: PoolWindow) -> Result<Option<Tensor>> {
    Ok(pool(x, window, false)?.map(|(y, _)| y))
}

/// [`forward`] and each window's first maximum (U8, NHWC), for [`backward_from_first`].
pub(super) fn forward_saving(x: &Tensor, window: PoolWindow) -> Result<Option<(Tensor, Tensor)>> {
    Ok(pool(x, window, true)?.and_then(|(y, first)| first.map(|f| (y, f))))
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

/// The input gradient of [`forward_saving`]`(x) = (y, first)` given `dy`, viewed channels-last
/// (`x` gives the shape only).
pub(super) fn backward_from_first(
    x: &Tensor,
    first: &Tensor,
    dy: &Tensor,
    window: PoolWindow,
) -> Result<Option<Tensor>> {
    if !applies(x, window) {
        return Ok(None);
    }
    let (n, c, h, w) = x.dims4()?;
    let (nchw, out) = shapes(window, &[n, h, w, c])?;
    let dy = nhwc(dy)?;
    if dy.shape() != &out || first.shape() != &out || first.dtype() != DType::U8 {
        bail!(
            "max_pool2d (NHWC): dy {:?} and first maxima {:?} {:?} do not match the output {:?}",
            dy.dims(),
            first.dims(),
            first.dtype(),
            out.dims()
        );
    }
    let (first_storage, first_layout) = first.storage_and_layout();
    let (dy_storage, dy_layout) = dy.storage_and_layout();
    let (Storage::Cuda(f), Storage::Cuda(d)) = (&*first_storage, &*dy_storage) else {
        bail!("max_pool2d (NHWC): CUDA tensors only");
    };
    let dx = run_backward_from_first(
        window,
        nchw,
        (f, first_layout, "first maxima"),
        (d, dy_layout, "dy"),
    )?;
    let [n, c, h, w] = nchw;
    let dx = Tensor::from_storage(Storage::Cuda(dx), (n, h, w, c), BackpropOp::none(), false);
    Ok(Some(from_nhwc(&dx)?))
}

/// The pooled `x` viewed channels-last and, with `keep_first`, the first maxima (NHWC).
fn pool(
    x: &Tensor,
    window: PoolWindow,
    keep_first: bool,
) -> Result<Option<(Tensor, Option<Tensor>)>> {
    if !applies(x, window) {
        return Ok(None);
    }
    let x = nhwc(x)?;
    let (nchw, out) = shapes(window, x.dims())?;
    let (storage, layout) = x.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        bail!("max_pool2d (NHWC): CUDA tensors only");
    };
    let (y, first) = run_forward(window, nchw, (cuda, layout, "x"), keep_first)?;
    let wrap = |s| Tensor::from_storage(Storage::Cuda(s), out.clone(), BackpropOp::none(), false);
    Ok(Some((from_nhwc(&wrap(y))?, first.map(wrap))))
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

/// The input gradient: args `(x, y, dy)` (NHWC).
struct PoolNhwcBackward {
    window: PoolWindow,
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
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
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
        let dx = run_backward(
            self.window,
            nchw,
            [(s1, l1, "x"), (s2, l2, "y"), (s3, l3, "dy")],
        )?;
        Ok((dx, l1.shape().clone()))
    }
}
