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
    t.permute((0, 2, 3, 1))?.contiguous()?.permute((0, 3, 1, 2))
}

/// The `N x H x W x C` contiguous tensor of `t`'s values: a view of a channels-last `t`, a
/// copy otherwise.
pub(crate) fn nhwc(t: &Tensor) -> Result<Tensor> {
    t.permute((0, 2, 3, 1))?.contiguous()
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
