//! A bf16 stride-2 convolution over at most four input channels (a ResNet's 7 x 7 / 2 stem
//! over RGB images) lowered to a stride-1 convolution over the input's 2 x 2 pixel blocks
//! stacked as channels (space-to-depth), with the filter rearranged to match: the same
//! products, summed in another order. cuDNN 9 has fast first-layer kernels for three fp16
//! channels but none for bf16: ResNet-50's stem took 1.45 ms of a bf16 step on an H100 (batch
//! 128; forward 0.77 and its channel padding 0.23, weight gradient 0.45), while a 4 x 4
//! convolution over 16 channels runs on the tensor cores like any other layer (forward 0.37,
//! the blocks 0.04 twice; bench-step 5,560 -> 5,716 images/s). Measured the same way and left
//! as they are: fp16 (5,776 images/s direct, 5,713 lowered) and f32 (2,957 direct, 2,901
//! lowered: cuDNN's best f32 weight gradient for the blocks is a 2.6 ms non-tensor-core
//! kernel). The channels-last cuDNN passes (`conv_nhwc`) apply it; the residual blocks'
//! `conv2d_backward_add` runs the convolution as it is.
//!
//! Block (i, j) of the input holds, in channel (dy * 2 + dx) * 4 + c, pixel
//! (2i + dy - p, 2j + dx - p) of channel c (zero outside the image and for c past the input's
//! channels); entry (o, (dy * 2 + dx) * 4 + c, a, b) of the lowered filter is w[o, c, 2a + dy,
//! 2b + dx] (zero past the kernel). Output pixel (y, x) then sums w[o, c, r, s] times pixel
//! (2y + r - p, 2x + s - p) over blocks y..y + kb and x..x + kb, with kb = ceil(k / 2): the
//! stride-2 convolution's sum.

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
use half::{bf16, f16};

use super::channels_last::{from_nhwc, nhwc};
use super::conv2d::conv_problem;
use super::conv_cpu::ConvProblem;

/// Input channels padded to this many: a block of 2 x 2 pixels fills 16 channels, a multiple
/// of the 8 that cuDNN's 16-bit tensor-core kernels want.
const CHANNELS: usize = 4;

/// The rearrangement for one convolution problem.
#[derive(Clone, Copy, Debug)]
pub(super) struct SpaceToDepth {
    problem: ConvProblem,
    /// The lowered kernel's side, ceil(k / 2).
    block_kernel: usize,
    /// Blocks down and across the padded input.
    blocks: (usize, usize),
}

impl SpaceToDepth {
    /// The rearrangement of a `dtype` convolution `problem` when it applies: bf16 (the module's
    /// header says why), stride 2, at most four input channels, a square kernel of at least
    /// 3 x 3.
    pub(super) fn for_problem(problem: &ConvProblem, dtype: DType) -> Option<Self> {
        Self::for_geometry(problem).filter(|_| dtype == DType::BF16)
    }

    /// [`SpaceToDepth::for_problem`] whatever the dtype (the CPU tests check the lowering in
    /// f64).
    pub(super) fn for_geometry(problem: &ConvProblem) -> Option<Self> {
        let g = &problem.geom;
        if g.stride != 2 || g.c_in > CHANNELS || g.k_h != g.k_w || g.k_h < 3 {
            return None;
        }
        let block_kernel = g.k_h.div_ceil(2);
        let blocks = (g.out_h + block_kernel - 1, g.out_w + block_kernel - 1);
        Some(Self {
            problem: *problem,
            block_kernel,
            blocks,
        })
    }

    /// The stride-1 problem over the blocks.
    pub(super) fn lowered(&self) -> Result<ConvProblem> {
        let (bh, bw) = self.blocks;
        let kb = self.block_kernel;
        conv_problem(
            &[self.problem.batch, 4 * CHANNELS, bh, bw],
            &[self.problem.c_out, 4 * CHANNELS, kb, kb],
            1,
            0,
        )
    }

    /// `x` (`N x C x H x W`, any layout) as blocks: `N x 16 x Hb x Wb`, channels-last, in one
    /// pass ([`Blocks`]).
    pub(super) fn input(&self, x: &Tensor) -> Result<Tensor> {
        let g = &self.problem.geom;
        let geometry = BlockGeometry {
            n: self.problem.batch,
            h: g.in_h,
            w: g.in_w,
            c: g.c_in,
            bh: self.blocks.0,
            bw: self.blocks.1,
            padding: g.padding,
        };
        let pixels = x.permute((0, 2, 3, 1))?.contiguous()?;
        from_nhwc(&pixels.apply_op1_no_bwd(&Blocks(geometry))?)
    }

    /// The filter `w` (`K x C x k x k`) for the blocks: `K x 16 x kb x kb`, channels-last (as
    /// the NHWC convolution reads it), in one pass: the blocks of `w`'s own `k x k` planes,
    /// unpadded (entry `(o, (dy * 2 + dx) * 4 + c, a, b)` is `w[o, c, 2a + dy, 2b + dx]`, the
    /// blocks' rule with `p = 0`). Built from padding, a six-axis permutation and a transpose
    /// to KRSC it took nine launches a forward.
    pub(super) fn filter(&self, w: &Tensor) -> Result<Tensor> {
        let g = &self.problem.geom;
        let kb = self.block_kernel;
        let geometry = BlockGeometry {
            n: self.problem.c_out,
            h: g.k_h,
            w: g.k_w,
            c: g.c_in,
            bh: kb,
            bw: kb,
            padding: 0,
        };
        let taps = w.permute((0, 2, 3, 1))?.contiguous()?;
        from_nhwc(&taps.apply_op1_no_bwd(&Blocks(geometry))?)
    }

    /// The gradient of `w` from that of [`SpaceToDepth::filter`]`(w)` (channels-last, as the
    /// NHWC passes give it): `K x C x k x k`, stored channels-last like the passes' other weight
    /// gradients.
    pub(super) fn filter_grad(&self, grad: &Tensor) -> Result<Tensor> {
        let g = &self.problem.geom;
        let (kb, k) = (self.block_kernel, g.k_h);
        let taps = nhwc(grad)?
            .reshape((self.problem.c_out, kb, kb, 2, 2, CHANNELS))?
            .permute((0, 1, 3, 2, 4, 5))?
            .contiguous()?
            .reshape((self.problem.c_out, 2 * kb, 2 * kb, CHANNELS))?
            .narrow(1, 0, k)?
            .narrow(2, 0, k)?
            .narrow(3, 0, g.c_in)?
            .contiguous()?;
        from_nhwc(&taps)
    }

    /// The gradient of the input from that of [`SpaceToDepth::input`]: channels-last when
    /// `channels_last`, contiguous NCHW otherwise.
    pub(super) fn input_grad(&self, grad: &Tensor, channels_last: bool) -> Result<Tensor> {
        let g = &self.problem.geom;
        let (n, p) = (self.problem.batch, g.padding);
        let (bh, bw) = self.blocks;
        let pixels = grad
            .permute((0, 2, 3, 1))?
            .contiguous()?
            .reshape((n, bh, bw, 2, 2, CHANNELS))?
            .permute((0, 1, 3, 2, 4, 5))?
            .contiguous()?
            .reshape((n, 2 * bh, 2 * bw, CHANNELS))?
            .narrow(1, p, g.in_h)?
            .narrow(2, p, g.in_w)?
            .narrow(3, 0, g.c_in)?
            .contiguous()?;
        match channels_last {
            true => from_nhwc(&pixels),
            false => pixels.permute((0, 3, 1, 2))?.contiguous(),
        }
    }
}

/// The sizes of one space-to-depth: `n` images of `h x w` pixels of `c` channels, zero-padded
/// by `padding` before, as `bh x bw` blocks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockGeometry {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub bh: usize,
    pub bw: usize,
    pub padding: usize,
}

impl BlockGeometry {
    /// Elements of the blocks (16 channels each).
    pub(crate) fn blocks_len(&self) -> usize {
        self.n * self.bh * self.bw * 4 * CHANNELS
    }

    /// Element `e` of the blocks: the index of its pixel in the NHWC input, or `None` where it
    /// is zero (as `kernels/space_to_depth.cu` computes it).
    fn source(&self, e: usize) -> Option<usize> {
        let channel = e % (4 * CHANNELS);
        let pixel = e / (4 * CHANNELS);
        let (j, rows) = (pixel % self.bw, pixel / self.bw);
        let (i, image) = (rows % self.bh, rows / self.bh);
        let k = channel % CHANNELS;
        let r = (2 * i + channel / 8).checked_sub(self.padding)?;
        let s = (2 * j + (channel / 4) % 2).checked_sub(self.padding)?;
        (k < self.c && r < self.h && s < self.w)
            .then(|| ((image * self.h + r) * self.w + s) * self.c + k)
    }

    fn gather<T: Copy + Default>(&self, x: &[T]) -> Vec<T> {
        (0..self.blocks_len())
            .map(|e| self.source(e).map_or(T::default(), |i| x[i]))
            .collect()
    }
}

/// The space-to-depth of a contiguous NHWC tensor: `kernels/space_to_depth.cu` on a GPU, the
/// same gather on the CPU.
struct Blocks(BlockGeometry);

impl CustomOp1 for Blocks {
    fn name(&self) -> &'static str {
        "space_to_depth"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let g = self.0;
        let Some((start, end)) = layout.contiguous_offsets() else {
            bail!("space_to_depth: the pixels must be contiguous");
        };
        let out = match storage {
            CpuStorage::F32(v) => CpuStorage::F32(g.gather(&v[start..end])),
            CpuStorage::F64(v) => CpuStorage::F64(g.gather(&v[start..end])),
            CpuStorage::BF16(v) => CpuStorage::BF16(g.gather::<bf16>(&v[start..end])),
            CpuStorage::F16(v) => CpuStorage::F16(g.gather::<f16>(&v[start..end])),
            _ => bail!("space_to_depth: the pixels must be f32, f64, bf16 or f16"),
        };
        Ok((out, Shape::from((g.n, g.bh, g.bw, 4 * CHANNELS))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        let g = self.0;
        let out = super::space_to_depth_cuda::blocks((storage, layout), g)?;
        Ok((out, Shape::from((g.n, g.bh, g.bw, 4 * CHANNELS))))
    }
}
