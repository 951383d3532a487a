//! The ResNet blocks' own backward passes ([`ExplicitBackward`]): a graph-free forward through
//! weft's kernels that keeps, per convolution + batch norm, the convolution's input, the batch
//! norm's input and output and its statistics, and the backward written out from them (ReLU
//! masks from the outputs, batch-norm and convolution gradients, one addition where the
//! shortcut meets the branch). Used in local training mode on tensors weft's kernels take;
//! otherwise (evaluation, SyncBatchNorm, other dtypes) the tape records Candle's graph.

use candle_core::Tensor;
use weft_tensor::ops::{self, BatchNormOutput};
use weft_tensor::{ExplicitBackward, ExplicitGrads, Mode, ParamGrad, Result, Saved, TensorError};

use super::{Residual, Stem};
use crate::layers::{BatchNorm2d, Conv2d};

/// What one convolution + batch norm keeps for its backward.
struct ConvBnSaved {
    /// The convolution's input.
    input: Tensor,
    /// The convolution's output, the batch norm's input.
    z: Tensor,
    out: BatchNormOutput,
}

impl ConvBnSaved {
    const LEN: usize = 4;

    fn forward(
        conv: &Conv2d,
        bn: &BatchNorm2d,
        x: &Tensor,
        mode: Mode,
        relu: bool,
    ) -> Result<Self> {
        let z = conv.forward_graph_free(x)?;
        let out = bn.forward_graph_free(&z, mode, relu)?;
        Ok(Self {
            input: x.clone(),
            z,
            out,
        })
    }

    fn push_to(self, saved: &mut Saved) {
        saved.extend([self.input, self.z, self.out.y, self.out.table]);
    }

    fn take_from(saved: &mut std::vec::IntoIter<Tensor>, block: &str) -> Result<Self> {
        let mut next = || {
            saved.next().ok_or_else(|| TensorError::Block {
                block: block.into(),
                message: "its saved tensors are incomplete".into(),
            })
        };
        Ok(Self {
            input: next()?,
            z: next()?,
            out: BatchNormOutput {
                y: next()?,
                table: next()?,
            },
        })
    }

    /// Gradients of the convolution's input (if `input_grad`) and, into `grads`, of the
    /// parameters, from the gradient of the batch norm's output (of its ReLU when `relu`).
    fn backward(
        &self,
        (conv, bn): (&Conv2d, &BatchNorm2d),
        dy: &Tensor,
        relu: bool,
        input_grad: bool,
        grads: &mut Vec<ParamGrad>,
    ) -> Result<Option<Tensor>> {
        let (dz, bn_grads) = bn.backward(&self.z, &self.out, dy, relu, true)?;
        let dz = dz.expect("the batch norm's input gradient was asked for");
        let (dx, conv_grad) = conv.backward(&self.input, &dz, input_grad)?;
        grads.extend(bn_grads);
        grads.push(conv_grad);
        Ok(dx)
    }
}

fn incomplete(block: &str) -> TensorError {
    TensorError::Block {
        block: block.into(),
        message: "its saved tensors are incomplete".into(),
    }
}

impl ExplicitBackward for Stem {
    fn forward_saving(&self, x: &Tensor, mode: Mode) -> Result<Option<(Tensor, Saved)>> {
        if !self.bn1.differentiates_itself(x, mode) {
            return Ok(None);
        }
        let conv_bn = ConvBnSaved::forward(&self.conv1, &self.bn1, x, mode, true)?;
        let mut saved = Vec::with_capacity(ConvBnSaved::LEN + 1);
        let y = if self.max_pool {
            let pooled = ops::max_pool2d_forward(&conv_bn.out.y, 3, 2, 1)?;
            saved.push(pooled.clone());
            pooled
        } else {
            conv_bn.out.y.clone()
        };
        conv_bn.push_to(&mut saved);
        Ok(Some((y, saved)))
    }

    fn backward(&self, saved: Saved, dy: &Tensor, input_grad: bool) -> Result<ExplicitGrads> {
        let mut saved = saved.into_iter();
        let pooled = if self.max_pool {
            Some(saved.next().ok_or_else(|| incomplete("stem"))?)
        } else {
            None
        };
        let conv_bn = ConvBnSaved::take_from(&mut saved, "stem")?;
        let dy = match pooled {
            Some(pooled) => ops::max_pool2d_backward(&conv_bn.out.y, &pooled, dy, 3, 2, 1)?,
            None => dy.clone(),
        };
        let mut params = Vec::with_capacity(3);
        let input =
            conv_bn.backward((&self.conv1, &self.bn1), &dy, true, input_grad, &mut params)?;
        Ok(ExplicitGrads { input, params })
    }
}

impl ExplicitBackward for Residual {
    fn forward_saving(&self, x: &Tensor, mode: Mode) -> Result<Option<(Tensor, Saved)>> {
        if !self.branch[0].1.differentiates_itself(x, mode) {
            return Ok(None);
        }
        let layers = self.branch.len() + usize::from(self.downsample.is_some());
        let mut saved = Vec::with_capacity(layers * ConvBnSaved::LEN + 1);
        let last = self.branch.len() - 1;
        let mut h = x.clone();
        for (i, (conv, bn)) in self.branch.iter().enumerate() {
            let conv_bn = ConvBnSaved::forward(conv, bn, &h, mode, i != last)?;
            h = conv_bn.out.y.clone();
            conv_bn.push_to(&mut saved);
        }
        let shortcut = match &self.downsample {
            Some((conv, bn)) => {
                let conv_bn = ConvBnSaved::forward(conv, bn, x, mode, false)?;
                let s = conv_bn.out.y.clone();
                conv_bn.push_to(&mut saved);
                s
            }
            None => x.clone(),
        };
        let y = ops::add_relu_forward(&h, &shortcut)?;
        saved.push(y.clone());
        Ok(Some((y, saved)))
    }

    fn backward(&self, saved: Saved, dy: &Tensor, input_grad: bool) -> Result<ExplicitGrads> {
        let mut saved = saved.into_iter();
        let branch = self
            .branch
            .iter()
            .map(|_| ConvBnSaved::take_from(&mut saved, &self.name))
            .collect::<Result<Vec<_>>>()?;
        let down = match self.downsample {
            Some(_) => Some(ConvBnSaved::take_from(&mut saved, &self.name)?),
            None => None,
        };
        let y = saved.next().ok_or_else(|| incomplete(&self.name))?;
        // relu(branch + shortcut): the same gradient flows into both.
        let g = ops::relu_backward(&y, dy)?;
        let mut params = Vec::with_capacity(3 * (branch.len() + 1));
        let shortcut_grad = match (&self.downsample, &down) {
            (Some((conv, bn)), Some(kept)) => {
                kept.backward((conv, bn), &g, false, input_grad, &mut params)?
            }
            _ => input_grad.then(|| g.clone()),
        };
        let last = self.branch.len() - 1;
        let mut grad = g;
        for (i, ((conv, bn), kept)) in self.branch.iter().zip(&branch).enumerate().rev() {
            let wanted = i > 0 || input_grad;
            if let Some(dx) = kept.backward((conv, bn), &grad, i != last, wanted, &mut params)? {
                grad = dx;
            }
        }
        let input = match shortcut_grad {
            Some(s) => Some((grad + s)?),
            None => None,
        };
        Ok(ExplicitGrads { input, params })
    }
}
