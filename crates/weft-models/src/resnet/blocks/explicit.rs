//! The ResNet blocks' own backward passes ([`ExplicitBackward`]): a graph-free forward through
//! weft's kernels that keeps, per convolution + batch norm, the convolution's input, the batch
//! norm's input and statistics (and its output where a ReLU mask needs it), and the backward
//! written out from them (ReLU masks from the outputs, batch-norm and convolution gradients;
//! where the shortcut meets the branch, the first convolution's input gradient is added in
//! place into the shortcut's). Used in training mode (SyncBatchNorm's included) on tensors
//! weft's kernels take; otherwise (evaluation, other dtypes) the tape records Candle's graph.

use candle_core::Tensor;
use weft_tensor::ops::{self, BatchNormOutput, ConvOperands};
use weft_tensor::{ExplicitBackward, ExplicitGrads, Mode, ParamGrad, Result, Saved, TensorError};

use super::{Residual, Stem};
use crate::layers::{BatchNorm2d, Conv2d};

/// What one convolution + batch norm keeps for its backward: the convolution's operands as the
/// forward read them (channels-last filters are not transposed again, a stem's pixel blocks
/// not built again), the batch norm's input and statistics, and its output only when a ReLU
/// follows (its mask). The output of a batch norm without ReLU (the largest tensors of a
/// bottleneck) is not kept.
struct ConvBnSaved {
    conv: ConvOperands,
    z: Tensor,
    table: Tensor,
    relu_output: Option<Tensor>,
}

/// What follows a convolution + batch norm.
#[derive(Clone, Copy)]
enum After<'a> {
    /// Nothing.
    Nothing,
    /// A ReLU (fused into the batch norm).
    Relu,
    /// The residual block's end, `max(y + shortcut, 0)` (fused into the batch norm where the
    /// kernels allow).
    AddRelu(&'a Tensor),
}

impl ConvBnSaved {
    /// Runs the convolution and the batch norm (then what `after` says) on `x`; returns the
    /// output and what the backward needs.
    fn forward(
        conv: &Conv2d,
        bn: &BatchNorm2d,
        x: &Tensor,
        mode: Mode,
        after: After<'_>,
    ) -> Result<(Tensor, Self)> {
        let (z, operands, sums) = conv.forward_graph_free(x)?;
        let sums = sums.as_ref();
        let BatchNormOutput { y, table, .. } = match after {
            After::AddRelu(shortcut) => bn.forward_graph_free_add_relu(&z, sums, mode, shortcut)?,
            _ => bn.forward_graph_free(&z, sums, mode, matches!(after, After::Relu))?,
        };
        let relu_output = matches!(after, After::Relu).then(|| y.clone());
        let kept = Self {
            conv: operands,
            z,
            table,
            relu_output,
        };
        Ok((y, kept))
    }

    fn push_to(self, saved: &mut Saved) {
        saved.extend(self.conv.saved());
        saved.extend([self.z, self.table]);
        saved.extend(self.relu_output);
    }

    fn take_from(
        saved: &mut std::vec::IntoIter<Tensor>,
        conv: &Conv2d,
        block: &str,
        relu: bool,
    ) -> Result<Self> {
        let mut next = || saved.next().ok_or_else(|| incomplete(block));
        Ok(Self {
            conv: conv.restore([next()?, next()?, next()?])?,
            z: next()?,
            table: next()?,
            relu_output: if relu { Some(next()?) } else { None },
        })
    }

    /// Gradients of the parameters (into `grads`) and of the convolution's input (as `input`
    /// says: returned when [`InputGrad::New`]), from the gradient of the batch norm's output
    /// (of its ReLU if it had one).
    fn backward(
        &self,
        (conv, bn): (&Conv2d, &BatchNorm2d),
        dy: &Tensor,
        input: InputGrad<'_>,
        grads: &mut Vec<ParamGrad>,
    ) -> Result<Option<Tensor>> {
        let relu_output = self.relu_output.as_ref();
        let (dz, bn_grads) = bn.backward(&self.z, &self.table, relu_output, dy, true)?;
        let dz = dz.expect("the batch norm's input gradient was asked for");
        grads.extend(bn_grads);
        let dx = match input {
            InputGrad::AddTo(acc) => {
                grads.push(conv.backward_add(&self.conv, &dz, acc)?);
                None
            }
            InputGrad::New | InputGrad::Skip => {
                let (dx, conv_grad) =
                    conv.backward(&self.conv, &dz, matches!(input, InputGrad::New))?;
                grads.push(conv_grad);
                dx
            }
        };
        Ok(dx)
    }
}

/// What a convolution's backward does with its input gradient.
#[derive(Clone, Copy)]
enum InputGrad<'a> {
    /// Not computed: nothing needs it.
    Skip,
    /// Returned as a new tensor.
    New,
    /// Added in place into this tensor, where a residual block's two input gradients meet.
    AddTo(&'a Tensor),
}

impl InputGrad<'_> {
    fn wanted(wanted: bool) -> Self {
        if wanted {
            Self::New
        } else {
            Self::Skip
        }
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
        let x = self.in_layout(x)?;
        let (h, conv_bn) = ConvBnSaved::forward(&self.conv1, &self.bn1, &x, mode, After::Relu)?;
        let mut saved = Vec::with_capacity(7);
        let y = if self.max_pool {
            let (pooled, pool_saved) = ops::max_pool2d_forward_saving(&h, 3, 2, 1)?;
            saved.push(pool_saved);
            pooled
        } else {
            h
        };
        conv_bn.push_to(&mut saved);
        Ok(Some((y, saved)))
    }

    fn backward(&self, saved: Saved, dy: &Tensor, input_grad: bool) -> Result<ExplicitGrads> {
        let mut saved = saved.into_iter();
        let pool_saved = if self.max_pool {
            Some(saved.next().ok_or_else(|| incomplete("stem"))?)
        } else {
            None
        };
        let conv_bn = ConvBnSaved::take_from(&mut saved, &self.conv1, "stem", true)?;
        let dy = match (pool_saved, &conv_bn.relu_output) {
            (Some(pool_saved), Some(h)) => {
                ops::max_pool2d_backward_saved(h, &pool_saved, dy, 3, 2, 1)?
            }
            _ => dy.clone(),
        };
        let mut params = Vec::with_capacity(3);
        let input = conv_bn.backward(
            (&self.conv1, &self.bn1),
            &dy,
            InputGrad::wanted(input_grad),
            &mut params,
        )?;
        Ok(ExplicitGrads { input, params })
    }
}

impl ExplicitBackward for Residual {
    fn forward_saving(&self, x: &Tensor, mode: Mode) -> Result<Option<(Tensor, Saved)>> {
        if !self.branch[0].1.differentiates_itself(x, mode) {
            return Ok(None);
        }
        let layers = self.branch.len() + usize::from(self.downsample.is_some());
        let mut saved = Vec::with_capacity(layers * 6 + 1);
        let last = self.branch.len() - 1;
        // The shortcut first, so that the branch's last batch norm ends the block in its pass.
        let (shortcut, down) = match &self.downsample {
            Some((conv, bn)) => {
                let (out, conv_bn) = ConvBnSaved::forward(conv, bn, x, mode, After::Nothing)?;
                (out, Some(conv_bn))
            }
            None => (x.clone(), None),
        };
        let mut h = x.clone();
        for (i, (conv, bn)) in self.branch.iter().enumerate() {
            let after = match i == last {
                true => After::AddRelu(&shortcut),
                false => After::Relu,
            };
            let (out, conv_bn) = ConvBnSaved::forward(conv, bn, &h, mode, after)?;
            h = out;
            conv_bn.push_to(&mut saved);
        }
        if let Some(conv_bn) = down {
            conv_bn.push_to(&mut saved);
        }
        let y = h;
        saved.push(y.clone());
        Ok(Some((y, saved)))
    }

    fn backward(&self, saved: Saved, dy: &Tensor, input_grad: bool) -> Result<ExplicitGrads> {
        let mut saved = saved.into_iter();
        let last = self.branch.len() - 1;
        let branch = (self.branch.iter().enumerate())
            .map(|(i, (conv, _))| ConvBnSaved::take_from(&mut saved, conv, &self.name, i != last))
            .collect::<Result<Vec<_>>>()?;
        let down = match &self.downsample {
            Some((conv, _)) => Some(ConvBnSaved::take_from(&mut saved, conv, &self.name, false)?),
            None => None,
        };
        let y = saved.next().ok_or_else(|| incomplete(&self.name))?;
        // relu(branch + shortcut): the same gradient flows into both.
        let g = ops::relu_backward(&y, dy)?;
        let mut params = Vec::with_capacity(3 * (branch.len() + 1));
        let shortcut_grad = match (&self.downsample, &down) {
            (Some((conv, bn)), Some(kept)) => {
                kept.backward((conv, bn), &g, InputGrad::wanted(input_grad), &mut params)?
            }
            _ => input_grad.then(|| g.clone()),
        };
        // The branch's first convolution adds its input gradient into the shortcut's (without
        // a downsample that is `g` itself, which nothing reads after the branch's last layer).
        let mut grad = g;
        for (i, ((conv, bn), kept)) in self.branch.iter().zip(&branch).enumerate().rev() {
            let input = match (i, &shortcut_grad) {
                (0, Some(acc)) => InputGrad::AddTo(acc),
                (0, None) => InputGrad::Skip,
                _ => InputGrad::New,
            };
            if let Some(dx) = kept.backward((conv, bn), &grad, input, &mut params)? {
                grad = dx;
            }
        }
        Ok(ExplicitGrads {
            input: shortcut_grad,
            params,
        })
    }
}
