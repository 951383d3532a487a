//! Channels-last tensors: `N x C x H x W` in shape, stored `N x H x W x C` (PyTorch's
//! `torch.channels_last` memory format), so cuDNN runs NHWC convolutions without transposes.
//! The graph-free kernels of a convolutional block keep the layout of their main input: a
//! channels-last input gives channels-last outputs, other operands are brought to it.

use candle_core::{Result, Tensor};

/// Whether `t` is a 4-d tensor stored channels-last (and not also plainly contiguous).
pub fn is_channels_last(t: &Tensor) -> bool {
    let (dims, stride) = (t.dims(), t.stride());
    match (dims, stride) {
        (&[_, c, h, w], &[s0, s1, s2, s3]) => {
            !t.is_contiguous() && s1 == 1 && s3 == c && s2 == w * c && s0 == h * w * c
        }
        _ => false,
    }
}

/// `t` (`N x C x H x W`) stored channels-last: a copy, or `t` itself when it already is.
pub fn to_channels_last(t: &Tensor) -> Result<Tensor> {
    if is_channels_last(t) {
        return Ok(t.clone());
    }
    from_nhwc(&nhwc(t)?)
}

/// The `N x H x W x C` contiguous tensor of `t`'s values: a view of a channels-last `t`, a
/// copy otherwise (on a GPU, of a contiguous `t`, a tiled transpose).
pub(crate) fn nhwc(t: &Tensor) -> Result<Tensor> {
    let view = t.permute((0, 2, 3, 1))?;
    if view.is_contiguous() {
        // Channels-last, or one channel or pixel (a 1 x 1 filter): nothing to move.
        return Ok(view);
    }
    #[cfg(feature = "cuda")]
    if let &[n, c, h, w] = t.dims() {
        if let Some(swapped) = swap_on_gpu(t, (n, c, h * w))? {
            return swapped.reshape((n, h, w, c));
        }
    }
    view.contiguous()
}

/// The contiguous `N x C x H x W` tensor of the contiguous `N x H x W x C` `nhwc` (on a GPU a
/// tiled transpose).
#[cfg(feature = "cudnn")]
pub(crate) fn nchw_from_nhwc(nhwc: &Tensor) -> Result<Tensor> {
    let view = nhwc.permute((0, 3, 1, 2))?;
    if view.is_contiguous() {
        return Ok(view);
    }
    if let &[n, h, w, c] = nhwc.dims() {
        if let Some(swapped) = swap_on_gpu(nhwc, (n, h * w, c))? {
            return swapped.reshape((n, c, h, w));
        }
    }
    view.contiguous()
}

/// `t` viewed as `[batch, rows, cols]` with its last two dimensions swapped by the batched
/// transpose kernel, when `t` is contiguous on a GPU and within the kernel's grid; `None`
/// otherwise.
#[cfg(feature = "cuda")]
fn swap_on_gpu(t: &Tensor, (batch, rows, cols): (usize, usize, usize)) -> Result<Option<Tensor>> {
    use super::transpose_cuda::{fits, transpose_batched};
    if !t.device().is_cuda() || !t.is_contiguous() || !fits(t.dtype(), (batch, rows, cols)) {
        return Ok(None);
    }
    Ok(Some(transpose_batched(&t.reshape((batch, rows, cols))?)?))
}

/// The channels-last `N x C x H x W` view of a contiguous `N x H x W x C` tensor.
pub(crate) fn from_nhwc(t: &Tensor) -> Result<Tensor> {
    t.permute((0, 3, 1, 2))
}

/// `f` over contiguous operands in the layout of `first`: channels-last operands as their NHWC
/// views (the others copied to match) and the result viewed channels-last again; otherwise
/// every operand contiguous. For element-wise kernels, which do not care which order they see.
pub(crate) fn in_layout_of(
    first: &Tensor,
    others: &[&Tensor],
    f: impl Fn(&Tensor, &[Tensor]) -> Result<Tensor>,
) -> Result<Tensor> {
    if is_channels_last(first) {
        let rest = others.iter().map(|t| nhwc(t)).collect::<Result<Vec<_>>>()?;
        return from_nhwc(&f(&nhwc(first)?, &rest)?);
    }
    let rest = others
        .iter()
        .map(|t| t.contiguous())
        .collect::<Result<Vec<_>>>()?;
    f(&first.contiguous()?, &rest)
}
