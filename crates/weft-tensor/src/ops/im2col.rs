//! Convolution geometry and the im2col / col2im transforms for one CHW image.
//!
//! The column matrix has one row per `(c_in, kernel_row, kernel_col)` triple, in that
//! order (matching an OIHW weight reshaped to `(c_out, c_in * kh * kw)`), and one column
//! per output pixel `(out_row, out_col)`. Several images may share one column matrix
//! side by side, so rows are addressed with an explicit row stride.

use super::storage::Float;
use std::ops::Range;

/// Shapes and hyper-parameters of a 2-D convolution of one image (groups 1, dilation 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConvGeometry {
    pub c_in: usize,
    pub in_h: usize,
    pub in_w: usize,
    pub k_h: usize,
    pub k_w: usize,
    pub stride: usize,
    pub padding: usize,
    pub out_h: usize,
    pub out_w: usize,
}

impl ConvGeometry {
    /// Elements in one input image (`c_in * in_h * in_w`).
    pub(crate) fn image_len(&self) -> usize {
        self.c_in * self.in_h * self.in_w
    }

    /// Output pixels per image and channel (`out_h * out_w`).
    pub(crate) fn out_pixels(&self) -> usize {
        self.out_h * self.out_w
    }

    /// Rows of the column matrix (`c_in * k_h * k_w`).
    pub(crate) fn col_rows(&self) -> usize {
        self.c_in * self.k_h * self.k_w
    }

    /// A 1x1, stride-1, unpadded convolution: the image already is its column matrix.
    pub(crate) fn is_pointwise(&self) -> bool {
        self.k_h == 1 && self.k_w == 1 && self.stride == 1 && self.padding == 0
    }
}

/// The output indices `o` in `0..out_len` whose input index `o * stride + offset - padding`
/// falls inside `0..in_len`, as a half-open range.
pub(crate) fn valid_outputs(
    out_len: usize,
    in_len: usize,
    offset: usize,
    stride: usize,
    padding: usize,
) -> (usize, usize) {
    let lo = padding.saturating_sub(offset).div_ceil(stride);
    let hi = (in_len + padding)
        .saturating_sub(offset)
        .div_ceil(stride)
        .min(out_len);
    (lo.min(hi), hi)
}

/// Writes the columns of output rows `out_rows` of the column matrix of `image`
/// (`c_in x in_h x in_w`) into `cols`: row `r` starts at `cols[r * row_stride]` and holds
/// `out_rows.len() * out_w` entries. Every entry is written (padding as zeros), so `cols`
/// need not be cleared beforehand.
pub(crate) fn im2col<T: Float>(
    image: &[T],
    g: &ConvGeometry,
    out_rows: Range<usize>,
    cols: &mut [T],
    row_stride: usize,
) {
    let (out_w, stride, pad) = (g.out_w, g.stride, g.padding);
    let width = out_rows.len() * out_w;
    let mut row = 0;
    for plane in image.chunks_exact(g.in_h * g.in_w) {
        for kr in 0..g.k_h {
            let (oh_lo, oh_hi) = valid_outputs(g.out_h, g.in_h, kr, stride, pad);
            let (oh_lo, oh_hi) = clamp_range(oh_lo, oh_hi, &out_rows);
            for kc in 0..g.k_w {
                let (ow_lo, ow_hi) = valid_outputs(out_w, g.in_w, kc, stride, pad);
                let dst_row = &mut cols[row * row_stride..][..width];
                row += 1;
                if ow_lo == ow_hi {
                    dst_row.fill(T::ZERO);
                    continue;
                }
                dst_row[..(oh_lo - out_rows.start) * out_w].fill(T::ZERO);
                dst_row[(oh_hi - out_rows.start) * out_w..].fill(T::ZERO);
                for oh in oh_lo..oh_hi {
                    let dst = &mut dst_row[(oh - out_rows.start) * out_w..][..out_w];
                    dst[..ow_lo].fill(T::ZERO);
                    dst[ow_hi..].fill(T::ZERO);
                    let src = &plane[(oh * stride + kr - pad) * g.in_w..][..g.in_w];
                    let src = &src[ow_lo * stride + kc - pad..];
                    let dst = &mut dst[ow_lo..ow_hi];
                    if stride == 1 {
                        dst.copy_from_slice(&src[..dst.len()]);
                    } else {
                        for (d, s) in dst.iter_mut().zip(src.iter().step_by(stride)) {
                            *d = *s;
                        }
                    }
                }
            }
        }
    }
}

/// Adds the columns of output rows `out_rows` of a column matrix (laid out as `im2col`
/// writes them) back onto the pixels of `image` they were gathered from: the adjoint of
/// `im2col`.
pub(crate) fn col2im<T: Float>(
    cols: &[T],
    row_stride: usize,
    g: &ConvGeometry,
    out_rows: Range<usize>,
    image: &mut [T],
) {
    let (out_w, stride, pad) = (g.out_w, g.stride, g.padding);
    let width = out_rows.len() * out_w;
    let mut row = 0;
    for plane in image.chunks_exact_mut(g.in_h * g.in_w) {
        for kr in 0..g.k_h {
            let (oh_lo, oh_hi) = valid_outputs(g.out_h, g.in_h, kr, stride, pad);
            let (oh_lo, oh_hi) = clamp_range(oh_lo, oh_hi, &out_rows);
            for kc in 0..g.k_w {
                let (ow_lo, ow_hi) = valid_outputs(out_w, g.in_w, kc, stride, pad);
                let src_row = &cols[row * row_stride..][..width];
                row += 1;
                if ow_lo == ow_hi {
                    continue;
                }
                for oh in oh_lo..oh_hi {
                    let src = &src_row[(oh - out_rows.start) * out_w..][ow_lo..ow_hi];
                    let dst = &mut plane[(oh * stride + kr - pad) * g.in_w..][..g.in_w];
                    let dst = &mut dst[ow_lo * stride + kc - pad..];
                    if stride == 1 {
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d += *s;
                        }
                    } else {
                        for (d, s) in dst.iter_mut().step_by(stride).zip(src) {
                            *d += *s;
                        }
                    }
                }
            }
        }
    }
}

/// The half-open range `lo..hi` intersected with `rows` (empty ranges collapse onto
/// `rows.start`).
fn clamp_range(lo: usize, hi: usize, rows: &Range<usize>) -> (usize, usize) {
    let hi = hi.clamp(rows.start, rows.end);
    (lo.clamp(rows.start, hi), hi)
}
