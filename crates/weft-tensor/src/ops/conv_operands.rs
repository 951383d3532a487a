//! A graph-free convolution's operands as its passes read them, prepared once for a forward
//! and its backward ([`ConvOperands`]): on the channels-last cuDNN path the filter transposed to
//! KRSC once rather than once a pass; for a bf16 stem, which those passes run lowered by
//! space-to-depth (`conv_space_to_depth`), the input's pixel blocks and the rearranged filter,
//! so that the weight gradient reads the forward's blocks instead of building them again
//! (40 µs of a ResNet-50 bf16 step at batch 128 on an H100). A block keeps the three tensors
//! ([`ConvOperands::saved`]) and restores them for its backward ([`ConvOperands::restore`]).

use candle_core::{Result, Tensor};

use super::conv2d::{
    conv2d_backward, conv2d_filter_for, conv2d_forward, conv2d_forward_with_sums, conv_problem,
};
use super::conv_add::conv2d_backward_add;

/// `x` and `w` of a graph-free convolution (stride and padding on both axes) as its passes
/// read them.
#[derive(Clone, Debug)]
pub struct ConvOperands {
    x: Tensor,
    w: Tensor,
    /// What the passes read as the input: `x`, or its space-to-depth blocks.
    input: Tensor,
    /// The filter as the passes read it: `w` itself, channels-last, or rearranged for the blocks.
    filter: Tensor,
    stride: usize,
    padding: usize,
    lowering: Option<Lowering>,
}

#[cfg(feature = "cudnn")]
type Lowering = super::conv_space_to_depth::SpaceToDepth;
/// No lowering without cuDNN.
#[cfg(not(feature = "cudnn"))]
#[derive(Clone, Copy, Debug)]
enum Lowering {}

/// The lowering the graph-free passes apply to the convolution of `x` with `w`, if any.
fn lowering_of(x: &Tensor, w: &Tensor, stride: usize, padding: usize) -> Result<Option<Lowering>> {
    let _problem = conv_problem(x.dims(), w.dims(), stride, padding)?;
    #[cfg(feature = "cudnn")]
    if super::conv2d::uses_nhwc(x) {
        return Ok(Lowering::for_problem(&_problem, x.dtype()));
    }
    Ok(None)
}

impl ConvOperands {
    /// Prepares the convolution of `x` (`N x C_in x H x W`) with `w` (`C_out x C_in x KH x
    /// KW`, the parameter): the tensors must take weft's kernels (`has_kernels`).
    pub fn new(x: &Tensor, w: &Tensor, stride: usize, padding: usize) -> Result<Self> {
        let lowering = lowering_of(x, w, stride, padding)?;
        let (input, filter) = match &lowering {
            #[cfg(feature = "cudnn")]
            Some(lowering) => (lowering.input(x)?, lowering.filter(w)?),
            #[cfg(not(feature = "cudnn"))]
            Some(never) => match *never {},
            None => (x.clone(), conv2d_filter_for(x, w)?),
        };
        Self::restore([x.clone(), input, filter], w, stride, padding)
    }

    /// The tensors a block keeps for the backward: `x`, the input and the filter as the passes
    /// read them (`x` twice, one storage, where the passes read it as it is).
    pub fn saved(&self) -> [Tensor; 3] {
        [self.x.clone(), self.input.clone(), self.filter.clone()]
    }

    /// The operands of [`ConvOperands::saved`]'s tensors `[x, input, filter]` for weight `w`.
    pub fn restore(
        [x, input, filter]: [Tensor; 3],
        w: &Tensor,
        stride: usize,
        padding: usize,
    ) -> Result<Self> {
        let lowering = lowering_of(&x, w, stride, padding)?;
        Ok(Self {
            x,
            w: w.clone(),
            input,
            filter,
            stride,
            padding,
            lowering,
        })
    }

    /// The stride and padding of the convolution the passes run.
    fn geometry(&self) -> (usize, usize) {
        match self.lowering {
            Some(_) => (1, 0),
            None => (self.stride, self.padding),
        }
    }

    /// The output, in `x`'s layout.
    pub fn forward(&self) -> Result<Tensor> {
        let (stride, padding) = self.geometry();
        let y = conv2d_forward(&self.input, &self.filter, stride, padding)?;
        match self.lowering.is_some() && !super::is_channels_last(&self.x) {
            true => y.contiguous(),
            false => Ok(y),
        }
    }

    /// [`ConvOperands::forward`] and its per-channel `[sum; sum of squares]` from the same
    /// cuDNN kernel, where `conv2d_forward_with_sums` gives them (channels-last `x` only).
    pub fn forward_with_sums(&self) -> Result<Option<(Tensor, Tensor)>> {
        if self.lowering.is_some() && !super::is_channels_last(&self.x) {
            return Ok(None);
        }
        let (stride, padding) = self.geometry();
        conv2d_forward_with_sums(&self.input, &self.filter, stride, padding)
    }

    /// The input gradient (when `input_grad`, in `x`'s layout) and the weight gradient (`w`'s
    /// shape, contiguous) from the output gradient `dy`.
    pub fn backward(&self, dy: &Tensor, input_grad: bool) -> Result<(Option<Tensor>, Tensor)> {
        let (stride, padding) = self.geometry();
        let (dx, dw) = conv2d_backward(&self.input, &self.filter, dy, stride, padding, input_grad)?;
        match &self.lowering {
            #[cfg(feature = "cudnn")]
            Some(lowering) => {
                let channels_last = super::is_channels_last(&self.x);
                let dx = dx
                    .map(|d| lowering.input_grad(&d, channels_last))
                    .transpose()?;
                Ok((dx, lowering.filter_grad(&dw)?))
            }
            #[cfg(not(feature = "cudnn"))]
            Some(never) => match *never {},
            None => Ok((dx, dw)),
        }
    }

    /// The weight gradient, with the input gradient added into `acc` in place (see
    /// `conv2d_backward_add`). A lowered convolution runs as it is here (building its blocks
    /// for the weight gradient): no network adds into a stem's input.
    pub fn backward_add(&self, acc: &Tensor, dy: &Tensor) -> Result<Tensor> {
        let filter = match self.lowering {
            Some(_) => conv2d_filter_for(&self.x, &self.w)?,
            None => self.filter.clone(),
        };
        conv2d_backward_add(acc, &self.x, &filter, dy, self.stride, self.padding)
    }
}
