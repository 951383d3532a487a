//! Max-pooling window geometry and the CPU kernels of `max_pool2d` on contiguous NCHW
//! slices, parallel over planes.

use super::storage::{dims4, CpuKernel, Float};
use candle_core::{bail, Result};
use rayon::prelude::*;
use std::ops::Range;

/// Square pooling window hyper-parameters.
#[derive(Clone, Copy, Debug)]
pub(super) struct PoolWindow {
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
}

impl PoolWindow {
    pub(super) fn new(kernel: usize, stride: usize, padding: usize) -> Self {
        Self {
            kernel,
            stride,
            padding,
        }
    }

    /// Validates `x`'s shape against the window and returns the pooled shape.
    pub(super) fn output_shape(&self, x_dims: &[usize]) -> Result<(usize, usize, usize, usize)> {
        let (n, c, h, w) = dims4(x_dims, "max_pool2d", "x")?;
        let Self {
            kernel,
            stride,
            padding,
        } = *self;
        if kernel == 0 || stride == 0 {
            bail!("max_pool2d: kernel ({kernel}) and stride ({stride}) must be positive");
        }
        if 2 * padding > kernel {
            bail!("max_pool2d: padding ({padding}) must be at most half the kernel ({kernel})");
        }
        if h + 2 * padding < kernel || w + 2 * padding < kernel {
            bail!("max_pool2d: kernel {kernel} is larger than the padded input of x {x_dims:?}");
        }
        let out = |len: usize| (len + 2 * padding - kernel) / stride + 1;
        Ok((n, c, out(h), out(w)))
    }

    /// Input indices covered by output index `o` along an axis of length `len`.
    fn span(&self, o: usize, len: usize) -> Range<usize> {
        let start = o * self.stride;
        start.saturating_sub(self.padding)..(start + self.kernel - self.padding).min(len)
    }
}

/// How many planes a pooling covers, and their input and output sizes.
#[derive(Clone, Copy, Debug)]
pub(super) struct PoolPlanes {
    /// Read by the CUDA launcher (the CPU kernels split the slices by plane size).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub count: usize,
    pub input: (usize, usize),
    pub output: (usize, usize),
}

/// A pooling kernel for planes of `in_hw` pooled to `out_hw`: the forward pass
/// (`x -> y`) or the backward pass (`(x, y, dy) -> dx`).
pub(super) struct PoolKernel {
    window: PoolWindow,
    in_hw: (usize, usize),
    out_hw: (usize, usize),
    /// For each kernel column offset, the output columns whose window has that column
    /// inside the input.
    valid_out_cols: Vec<Range<usize>>,
    backward: bool,
}

impl PoolKernel {
    pub(super) fn new(
        window: PoolWindow,
        in_hw: (usize, usize),
        out_hw: (usize, usize),
        backward: bool,
    ) -> Self {
        let valid_out_cols = (0..window.kernel)
            .map(|kc| {
                let inside = |ow: &usize| {
                    (ow * window.stride + kc)
                        .checked_sub(window.padding)
                        .is_some_and(|col| col < in_hw.1)
                };
                let start = (0..out_hw.1).find(inside).unwrap_or(out_hw.1);
                start
                    ..(start..out_hw.1)
                        .rfind(inside)
                        .map_or(start, |last| last + 1)
            })
            .collect();
        Self {
            window,
            in_hw,
            out_hw,
            valid_out_cols,
            backward,
        }
    }

    /// Pools one plane into `y`. A whole output row is reduced at once, so the running
    /// maxima of its windows form independent, branch-free dependency chains; a window
    /// holding a NaN pools to NaN, as in PyTorch.
    fn forward_plane<T: Float>(&self, x: &[T], y: &mut [T], maxima: &mut RowMaxima<T>) {
        let ((in_h, in_w), out_w) = (self.in_hw, self.out_hw.1);
        let (stride, padding) = (self.window.stride, self.window.padding);
        for (oh, y_row) in y.chunks_exact_mut(out_w).enumerate() {
            maxima.reset(out_w);
            for r in self.window.span(oh, in_h) {
                let row = &x[r * in_w..][..in_w];
                for (kc, valid) in self.valid_out_cols.iter().enumerate() {
                    let first_col = (valid.start * stride + kc).saturating_sub(padding);
                    let best = &mut maxima.value[valid.clone()];
                    let nan = &mut maxima.nan[valid.clone()];
                    for (j, (best, nan)) in best.iter_mut().zip(nan).enumerate() {
                        let value = row[first_col + j * stride];
                        *best = if value > *best { value } else { *best };
                        *nan |= value.is_nan();
                    }
                }
            }
            for ((dst, &best), &nan) in y_row.iter_mut().zip(&maxima.value).zip(&maxima.nan) {
                *dst = if nan { T::NAN } else { best };
            }
        }
    }

    /// Routes each output gradient of one plane to the first (row-major) input of its
    /// window equal to the pooled value `y` (the first NaN when `y` is NaN).
    fn backward_plane<T: Float>(&self, x: &[T], y: &[T], dy: &[T], dx: &mut [T]) {
        let ((in_h, in_w), out_w) = (self.in_hw, self.out_hw.1);
        for (o, (&pooled, &grad)) in y.iter().zip(dy).enumerate() {
            let cols = self.window.span(o % out_w, in_w);
            let is_max = |v: T| v == pooled || (pooled.is_nan() && v.is_nan());
            let first_max = self.window.span(o / out_w, in_h).find_map(|r| {
                let row = &x[r * in_w..][cols.clone()];
                row.iter()
                    .position(|&v| is_max(v))
                    .map(|c| r * in_w + cols.start + c)
            });
            if let Some(index) = first_max {
                dx[index] += grad;
            }
        }
    }
}

/// Running maxima of the windows of one output row, and whether each saw a NaN.
struct RowMaxima<T> {
    value: Vec<T>,
    nan: Vec<bool>,
}

impl<T: Float> RowMaxima<T> {
    fn reset(&mut self, len: usize) {
        self.value.clear();
        self.value.resize(len, T::NEG_INFINITY);
        self.nan.clear();
        self.nan.resize(len, false);
    }
}

impl<T> Default for RowMaxima<T> {
    fn default() -> Self {
        Self {
            value: Vec::new(),
            nan: Vec::new(),
        }
    }
}

impl CpuKernel for PoolKernel {
    fn run<T: Float>(&self, args: &[&[T]]) -> Result<Vec<T>> {
        let (in_len, out_len) = (self.in_hw.0 * self.in_hw.1, self.out_hw.0 * self.out_hw.1);
        match (self.backward, args) {
            (false, &[x]) => {
                let mut y = vec![T::ZERO; x.len() / in_len * out_len];
                y.par_chunks_mut(out_len)
                    .zip(x.par_chunks(in_len))
                    .for_each_init(RowMaxima::default, |maxima, (y, x)| {
                        self.forward_plane(x, y, maxima)
                    });
                Ok(y)
            }
            (true, &[x, y, dy]) => {
                let mut dx = vec![T::ZERO; x.len()];
                dx.par_chunks_mut(in_len)
                    .zip(x.par_chunks(in_len))
                    .zip(y.par_chunks(out_len).zip(dy.par_chunks(out_len)))
                    .for_each(|((dx, x), (y, dy))| self.backward_plane(x, y, dy, dx));
                Ok(dx)
            }
            _ => bail!("max_pool2d kernel: wrong argument count {}", args.len()),
        }
    }
}
