//! `Conv2d` without bias (as every ResNet convolution), Kaiming-normal initialised
//! (`mode="fan_out"`, `nonlinearity="relu"`, as torchvision's ResNet).

use candle_core::{Tensor, Var};
use weft_tensor::{ops, ParamGrad, Scope};

use super::Init;
use weft_tensor::Result;

/// A bias-free 2-D convolution with square kernel, equal stride and zero padding.
pub struct Conv2d {
    weight: Var,
    stride: usize,
    padding: usize,
}

impl Conv2d {
    /// Registers `weight` of shape `[out, in, k, k]` in `scope`.
    pub fn new(
        scope: &mut Scope,
        init: &mut Init,
        in_ch: usize,
        out_ch: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
    ) -> Result<Self> {
        let fan_out = (out_ch * kernel * kernel) as f64;
        let w = init.normal(
            &[out_ch, in_ch, kernel, kernel],
            (2.0 / fan_out).sqrt(),
            scope.dtype(),
            &scope.device(),
        )?;
        Ok(Self {
            weight: scope.parameter("weight", w)?,
            stride,
            padding,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(ops::conv2d(x, &self.weight, self.stride, self.padding)?)
    }

    /// [`Conv2d::forward`] without an autograd graph (blocks with their own backward); returns
    /// the output, the filter as the passes over `x` read it ([`ops::conv2d_filter_for`]), for
    /// [`Conv2d::backward`] and [`Conv2d::backward_add`], and, where one cuDNN kernel computes
    /// them with the output, the output's per-channel `[sum; sum of squares]`
    /// ([`ops::conv2d_forward_with_sums`]) for the batch norm after it.
    pub fn forward_graph_free(&self, x: &Tensor) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        let filter = ops::conv2d_filter_for(x, self.weight.as_tensor())?;
        if let Some((y, sums)) =
            ops::conv2d_forward_with_sums(x, &filter, self.stride, self.padding)?
        {
            return Ok((y, filter, Some(sums)));
        }
        let y = ops::conv2d_forward(x, &filter, self.stride, self.padding)?;
        Ok((y, filter, None))
    }

    /// The input gradient (if `input_grad`) and the weight's gradient, keyed by its id, from
    /// the input `x` and the `filter` of [`Conv2d::forward_graph_free`].
    pub fn backward(
        &self,
        (x, filter): (&Tensor, &Tensor),
        dy: &Tensor,
        input_grad: bool,
    ) -> Result<(Option<Tensor>, ParamGrad)> {
        let (dx, dw) = ops::conv2d_backward(x, filter, dy, self.stride, self.padding, input_grad)?;
        Ok((dx, (self.weight.id(), dw)))
    }

    /// [`Conv2d::backward`] with the input gradient added into `acc` in place (see
    /// [`ops::conv2d_backward_add`]); returns the weight's gradient.
    pub fn backward_add(
        &self,
        (x, filter): (&Tensor, &Tensor),
        dy: &Tensor,
        acc: &Tensor,
    ) -> Result<ParamGrad> {
        let dw = ops::conv2d_backward_add(acc, x, filter, dy, self.stride, self.padding)?;
        Ok((self.weight.id(), dw))
    }
}
