//! Convolutions whose kernel, on some rows or columns of taps, meets only padding for every
//! output (a 3×3 kernel with padding 1 over a 1×1 map: every tap but the centre; 3×3 with stride
//! 2 over a 2×2 map: the first row and column). Those taps multiply zeros, so the convolution
//! equals one with the kernel cropped to the taps that reach the image and the padding reduced
//! to match. The CPU kernels run the cropped problem (ResNet-18's last stage on 32×32 inputs
//! does a ninth of the work) and scatter its weight gradient back into the full kernel's shape.

use std::ops::Range;

use super::conv_cpu::ConvProblem;
use super::im2col::{valid_outputs, ConvGeometry};
use super::storage::Float;

/// The taps of a convolution that reach the image, and the problem that uses only them.
pub(crate) struct Crop {
    /// The full kernel's height and width.
    kernel: (usize, usize),
    rows: Range<usize>,
    cols: Range<usize>,
    pub(crate) problem: ConvProblem,
}

/// The taps `0..kernel` of one axis that meet the image for at least one output, when they
/// form one range.
fn reaching_taps(
    kernel: usize,
    out: usize,
    input: usize,
    stride: usize,
    pad: usize,
) -> Option<Range<usize>> {
    let reaches = |k: usize| {
        let (lo, hi) = valid_outputs(out, input, k, stride, pad);
        lo < hi
    };
    let first = (0..kernel).find(|&k| reaches(k))?;
    let end = (first..kernel).find(|&k| !reaches(k)).unwrap_or(kernel);
    (end..kernel).all(|k| !reaches(k)).then_some(first..end)
}

impl Crop {
    /// The cropped problem of `p`, when some taps never reach the image and cropping them
    /// keeps the output's shape (padding stays the same on every side).
    pub(crate) fn of(p: &ConvProblem) -> Option<Crop> {
        let g = &p.geom;
        let rows = reaching_taps(g.k_h, g.out_h, g.in_h, g.stride, g.padding)?;
        let cols = reaching_taps(g.k_w, g.out_w, g.in_w, g.stride, g.padding)?;
        if (rows.len(), cols.len()) == (g.k_h, g.k_w) || rows.start != cols.start {
            return None;
        }
        let padding = g.padding.checked_sub(rows.start)?;
        let out = |input: usize, kernel: usize| {
            (input + 2 * padding)
                .checked_sub(kernel)
                .map(|span| span / g.stride + 1)
        };
        if out(g.in_h, rows.len()) != Some(g.out_h) || out(g.in_w, cols.len()) != Some(g.out_w) {
            return None;
        }
        let geom = ConvGeometry {
            k_h: rows.len(),
            k_w: cols.len(),
            padding,
            ..*g
        };
        Some(Crop {
            kernel: (g.k_h, g.k_w),
            rows,
            cols,
            problem: ConvProblem { geom, ..*p },
        })
    }

    /// The taps of an OIHW weight of the full problem that the cropped one uses.
    pub(crate) fn weight<T: Float>(&self, w: &[T]) -> Vec<T> {
        let (k_h, k_w) = self.kernel;
        let mut cropped =
            Vec::with_capacity(w.len() / (k_h * k_w) * self.rows.len() * self.cols.len());
        for kernel in w.chunks_exact(k_h * k_w) {
            for row in self.rows.clone() {
                cropped.extend_from_slice(&kernel[row * k_w..][self.cols.clone()]);
            }
        }
        cropped
    }

    /// The full kernel's weight gradient from the cropped one's (zero on the cropped taps).
    pub(crate) fn full_weight_grad<T: Float>(&self, dw: &[T]) -> Vec<T> {
        let (k_h, k_w) = self.kernel;
        let taps = self.rows.len() * self.cols.len();
        let mut full = vec![T::ZERO; dw.len() / taps * k_h * k_w];
        for (kernel, grad) in full.chunks_exact_mut(k_h * k_w).zip(dw.chunks_exact(taps)) {
            for (row, grad_row) in self.rows.clone().zip(grad.chunks_exact(self.cols.len())) {
                kernel[row * k_w..][self.cols.clone()].copy_from_slice(grad_row);
            }
        }
        full
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(input: usize, kernel: usize, stride: usize, padding: usize) -> ConvProblem {
        let out = (input + 2 * padding - kernel) / stride + 1;
        ConvProblem {
            batch: 2,
            c_out: 3,
            geom: ConvGeometry {
                c_in: 2,
                in_h: input,
                in_w: input,
                k_h: kernel,
                k_w: kernel,
                stride,
                padding,
                out_h: out,
                out_w: out,
            },
        }
    }

    #[test]
    fn taps_on_padding_alone_are_cropped() {
        let centre = Crop::of(&problem(1, 3, 1, 1)).unwrap();
        assert_eq!((centre.rows.clone(), centre.cols.clone()), (1..2, 1..2));
        let g = centre.problem.geom;
        assert_eq!((g.k_h, g.padding, g.out_h), (1, 0, 1));
        let strided = Crop::of(&problem(2, 3, 2, 1)).unwrap();
        assert_eq!(strided.rows, 1..3);
        assert_eq!(
            (strided.problem.geom.k_h, strided.problem.geom.padding),
            (2, 0)
        );
        for whole in [
            problem(2, 3, 1, 1),
            problem(8, 3, 1, 1),
            problem(4, 1, 2, 0),
        ] {
            assert!(Crop::of(&whole).is_none());
        }
    }

    #[test]
    fn weights_are_cropped_and_their_gradients_scattered_back() {
        let crop = Crop::of(&problem(2, 3, 2, 1)).unwrap();
        let w: Vec<f64> = (0..3 * 2 * 9).map(f64::from).collect();
        let cropped = crop.weight(&w);
        assert_eq!(cropped.len(), 3 * 2 * 4);
        assert_eq!(&cropped[..4], &[4.0, 5.0, 7.0, 8.0]);
        let full = crop.full_weight_grad(&cropped);
        for (i, (f, original)) in full.iter().zip(&w).enumerate() {
            let (r, c) = ((i % 9) / 3, i % 3);
            let expected = if r >= 1 && c >= 1 { *original } else { 0.0 };
            assert_eq!(*f, expected, "tap {i}");
        }
    }
}
