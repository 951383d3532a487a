//! CPU convolution kernels on contiguous NCHW input / OIHW weight slices: forward,
//! backward-data (input gradient) and backward-filter (weight gradient).
//!
//! Work is split into tiles of about `TARGET_TILE_COLUMNS` output pixels: a band of output
//! rows of one image, or several whole images when images are small. A tile's column
//! matrix (from `im2col`) then stays in the core's L2 cache while its GEMM consumes it, and
//! small feature maps still give GEMMs wide enough to run near peak. Images (or groups of
//! images) run in parallel with rayon, each GEMM single-threaded, with per-thread scratch
//! buffers reused across calls. Taps that only ever meet padding are cropped away first
//! (`conv_crop`).

use super::conv_crop::Crop;
use super::im2col::{col2im, im2col, ConvGeometry};
use super::matmul::{gemm, Operand};
use super::scratch::Scratch;
use super::storage::Float;
use gemm::Parallelism;
use rayon::prelude::*;
use std::ops::Range;

/// Output pixels (GEMM columns) a tile aims for.
const TARGET_TILE_COLUMNS: usize = 256;

/// A batched convolution problem: `batch` images of geometry `geom`, `c_out` filters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConvProblem {
    pub batch: usize,
    pub c_out: usize,
    pub geom: ConvGeometry,
}

/// Output rows `rows` of images `first..first + images` (all rows when `images > 1`).
struct Tile {
    first: usize,
    images: usize,
    rows: Range<usize>,
}

impl ConvProblem {
    /// Images per parallel unit: several only when one image has too few output pixels
    /// for a tile, and never so many that a rayon thread would be left without a unit.
    fn images_per_unit(&self) -> usize {
        let per_thread = (self.batch / rayon::current_num_threads()).max(1);
        TARGET_TILE_COLUMNS
            .div_ceil(self.geom.out_pixels())
            .clamp(1, per_thread)
    }

    /// Number of parallel units.
    fn units(&self) -> usize {
        self.batch.div_ceil(self.images_per_unit())
    }

    /// The tiles of parallel unit `unit`, in order.
    fn tiles(&self, unit: usize) -> impl Iterator<Item = Tile> {
        let per_unit = self.images_per_unit();
        let first = unit * per_unit;
        let images = per_unit.min(self.batch - first);
        let out_h = self.geom.out_h;
        let band = if images > 1 {
            out_h
        } else {
            (TARGET_TILE_COLUMNS / self.geom.out_w).clamp(1, out_h)
        };
        (0..out_h).step_by(band).map(move |start| Tile {
            first,
            images,
            rows: start..(start + band).min(out_h),
        })
    }

    /// Parallelism inside one GEMM: only when there are too few units to share out.
    fn gemm_parallelism(&self) -> Parallelism {
        let threads = rayon::current_num_threads();
        if self.units() < threads {
            Parallelism::Rayon(threads)
        } else {
            Parallelism::None
        }
    }

    /// The widest tile's width (GEMM columns).
    fn max_tile_width(&self) -> usize {
        self.tiles(0)
            .map(|tile| tile.images * self.tile_pixels(&tile))
            .max()
            .unwrap_or(0)
    }

    /// Elements of one output image (`c_out * out_pixels`).
    fn out_image_len(&self) -> usize {
        self.c_out * self.geom.out_pixels()
    }

    /// Output pixels of one image inside `tile`.
    fn tile_pixels(&self, tile: &Tile) -> usize {
        tile.rows.len() * self.geom.out_w
    }
}

/// The column matrix of `tile` of `x`, built in `buf`; a pointwise single-image tile is
/// used in place.
fn tile_columns<'a, T: Float>(
    x: &'a [T],
    p: &ConvProblem,
    tile: &Tile,
    buf: &'a mut [T],
) -> Operand<'a, T> {
    let (g, image_len, pixels) = (&p.geom, p.geom.image_len(), p.tile_pixels(tile));
    if tile.images == 1 && g.is_pointwise() {
        let offset = tile.first * image_len + tile.rows.start * g.out_w;
        return Operand::normal(&x[offset..], g.out_pixels());
    }
    let width = tile.images * pixels;
    let buf = &mut buf[..g.col_rows() * width];
    for i in 0..tile.images {
        let image = &x[(tile.first + i) * image_len..][..image_len];
        im2col(image, g, tile.rows.clone(), &mut buf[i * pixels..], width);
    }
    Operand::normal(buf, width)
}

/// The `c_out x tile pixels` output-gradient matrix of `tile`; single-image tiles are
/// used in place, several images are gathered side by side in `buf`.
fn tile_output_rows<'a, T: Float>(
    dy: &'a [T],
    p: &ConvProblem,
    tile: &Tile,
    buf: &'a mut [T],
) -> Operand<'a, T> {
    let (out_image_len, all_pixels) = (p.out_image_len(), p.geom.out_pixels());
    if tile.images == 1 {
        let offset = tile.first * out_image_len + tile.rows.start * p.geom.out_w;
        return Operand::normal(&dy[offset..], all_pixels);
    }
    let width = tile.images * all_pixels;
    let buf = &mut buf[..p.c_out * width];
    for i in 0..tile.images {
        let image = &dy[(tile.first + i) * out_image_len..][..out_image_len];
        for (c, src) in image.chunks_exact(all_pixels).enumerate() {
            buf[c * width + i * all_pixels..][..all_pixels].copy_from_slice(src);
        }
    }
    Operand::normal(buf, width)
}

/// Forward convolution: `y[n] = W (c_out x col_rows) * cols(x[n])`, NCHW output.
pub(crate) fn conv_forward<T: Float>(x: &[T], w: &[T], p: &ConvProblem) -> Vec<T> {
    if let Some(crop) = Crop::of(p) {
        return conv_forward(x, &crop.weight(w), &crop.problem);
    }
    let (c_out, rows, all_pixels) = (p.c_out, p.geom.col_rows(), p.geom.out_pixels());
    let mut y = vec![T::ZERO; p.batch * p.out_image_len()];
    let parallelism = p.gemm_parallelism();
    let unit_len = p.images_per_unit() * p.out_image_len();
    let max_width = p.max_tile_width();
    y.par_chunks_mut(unit_len)
        .enumerate()
        .for_each(|(unit, y_unit)| {
            Scratch::with(|scratch| {
                let (cols_buf, out) = scratch.buffers(rows * max_width, c_out * max_width);
                for tile in p.tiles(unit) {
                    let width = tile.images * p.tile_pixels(&tile);
                    let cols = tile_columns(x, p, &tile, cols_buf);
                    let (shape, lhs) = ((c_out, width, rows), Operand::normal(w, rows));
                    if tile.images == 1 {
                        let dst = &mut y_unit[tile.rows.start * p.geom.out_w..];
                        gemm(shape, dst, all_pixels, false, lhs, cols, parallelism);
                        continue;
                    }
                    gemm(shape, out, width, false, lhs, cols, parallelism);
                    for (i, y_image) in y_unit.chunks_exact_mut(p.out_image_len()).enumerate() {
                        for (c, dst) in y_image.chunks_exact_mut(all_pixels).enumerate() {
                            dst.copy_from_slice(&out[c * width + i * all_pixels..][..all_pixels]);
                        }
                    }
                }
            })
        });
    y
}

/// Input gradient: `dx[n] = col2im(W^T * dy[n])`.
pub(crate) fn conv_backward_data<T: Float>(dy: &[T], w: &[T], p: &ConvProblem) -> Vec<T> {
    if let Some(crop) = Crop::of(p) {
        return conv_backward_data(dy, &crop.weight(w), &crop.problem);
    }
    let g = &p.geom;
    let (c_out, rows, image_len) = (p.c_out, g.col_rows(), g.image_len());
    let mut dx = vec![T::ZERO; p.batch * image_len];
    let parallelism = p.gemm_parallelism();
    let max_width = p.max_tile_width();
    dx.par_chunks_mut(p.images_per_unit() * image_len)
        .enumerate()
        .for_each(|(unit, dx_unit)| {
            Scratch::with(|scratch| {
                let (cols, dy_buf) = scratch.buffers(rows * max_width, c_out * max_width);
                for tile in p.tiles(unit) {
                    let pixels = p.tile_pixels(&tile);
                    let width = tile.images * pixels;
                    let dy_tile = tile_output_rows(dy, p, &tile, dy_buf);
                    let (shape, lhs) = ((rows, width, c_out), Operand::transposed(w, rows));
                    if tile.images == 1 && g.is_pointwise() {
                        let dst = &mut dx_unit[tile.rows.start * g.out_w..];
                        gemm(shape, dst, g.out_pixels(), false, lhs, dy_tile, parallelism);
                        continue;
                    }
                    gemm(shape, cols, width, false, lhs, dy_tile, parallelism);
                    for (i, dx_image) in dx_unit.chunks_exact_mut(image_len).enumerate() {
                        col2im(&cols[i * pixels..], width, g, tile.rows.clone(), dx_image);
                    }
                }
            })
        });
    dx
}

/// Weight gradient: `dW = sum_n dy[n] * cols(x[n])^T`, one accumulator per group of units.
/// The units are cut into a fixed, ordered partition (one group per rayon thread) and the
/// groups' sums added in order, so the floating-point sums do not depend on which thread ran
/// what: a run is reproducible for a given thread count (a rayon `fold` splits wherever work
/// is stolen, and its sums differ from run to run).
pub(crate) fn conv_backward_filter<T: Float>(x: &[T], dy: &[T], p: &ConvProblem) -> Vec<T> {
    if let Some(crop) = Crop::of(p) {
        return crop.full_weight_grad(&conv_backward_filter(x, dy, &crop.problem));
    }
    let (c_out, rows) = (p.c_out, p.geom.col_rows());
    let parallelism = p.gemm_parallelism();
    let max_width = p.max_tile_width();
    let units = p.units();
    let groups = units.min(rayon::current_num_threads()).max(1);
    let partials: Vec<Vec<T>> = (0..groups)
        .into_par_iter()
        .map(|g| {
            let mut dw = vec![T::ZERO; c_out * rows];
            Scratch::with(|scratch| {
                let (cols, dy_buf) = scratch.buffers(rows * max_width, c_out * max_width);
                for unit in g * units / groups..(g + 1) * units / groups {
                    for tile in p.tiles(unit) {
                        let width = tile.images * p.tile_pixels(&tile);
                        let x_cols = tile_columns(x, p, &tile, cols).transpose();
                        let dy_tile = tile_output_rows(dy, p, &tile, dy_buf);
                        let shape = (c_out, rows, width);
                        gemm(shape, &mut dw, rows, true, dy_tile, x_cols, parallelism);
                    }
                }
            });
            dw
        })
        .collect();
    partials
        .into_iter()
        .reduce(|mut total, part| {
            total.iter_mut().zip(&part).for_each(|(t, v)| *t += *v);
            total
        })
        .unwrap_or_else(|| vec![T::ZERO; c_out * rows])
}
