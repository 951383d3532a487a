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
    /// the output, the operands as the passes read them ([`ops::ConvOperands`]: a channels-last
    /// filter, a stem's space-to-depth blocks), for [`Conv2d::backward`] and
    /// [`Conv2d::backward_add`], and, where one cuDNN kernel computes them with the output, the
    /// output's per-channel `[sum; sum of squares]` for the batch norm after it.
    pub fn forward_graph_free(
        &self,
        x: &Tensor,
    ) -> Result<(Tensor, ops::ConvOperands, Option<Tensor>)> {
        let operands =
            ops::ConvOperands::new(x, self.weight.as_tensor(), self.stride, self.padding)?;
        if let Some((y, sums)) = operands.forward_with_sums()? {
            return Ok((y, operands, Some(sums)));
        }
        let y = operands.forward()?;
        Ok((y, operands, None))
    }

    /// The operands of [`Conv2d::forward_graph_free`] from the tensors a block kept of them
    /// ([`ops::ConvOperands::saved`]).
    pub fn restore(&self, saved: [Tensor; 3]) -> Result<ops::ConvOperands> {
        let w = self.weight.as_tensor();
        Ok(ops::ConvOperands::restore(
            saved,
            w,
            self.stride,
            self.padding,
        )?)
    }

    /// The input gradient (if `input_grad`) and the weight's gradient, keyed by its id, from
    /// the operands of [`Conv2d::forward_graph_free`].
    pub fn backward(
        &self,
        operands: &ops::ConvOperands,
        dy: &Tensor,
        input_grad: bool,
    ) -> Result<(Option<Tensor>, ParamGrad)> {
        let (dx, dw) = operands.backward(dy, input_grad)?;
        Ok((dx, (self.weight.id(), dw)))
    }

    /// [`Conv2d::backward`] with the input gradient added into `acc` in place (see
    /// [`ops::conv2d_backward_add`]); returns the weight's gradient.
    pub fn backward_add(
        &self,
        operands: &ops::ConvOperands,
        dy: &Tensor,
        acc: &Tensor,
    ) -> Result<ParamGrad> {
        let dw = operands.backward_add(acc, dy)?;
        Ok((self.weight.id(), dw))
    }
}
