//! Operations over many tensors at once, for the per-step bookkeeping of training: writing a
//! block's gradients into the flat gradient buffer, gathering and scattering BatchNorm buffers
//! around a broadcast, and the SGD update of every parameter. On CUDA each runs as one kernel
//! launch per 48 tensors (`kernels/multi_tensor.cu`, PyTorch's `multi_tensor_apply`) instead of
//! one or more per tensor; on the CPU they loop over the tensors.

use candle_core::{bail, DType, Result, Tensor};

/// Copies each `(source, destination)` pair: same dtype and number of elements, destination
/// contiguous (a variable, or a slot of a flat buffer). Shapes may differ.
pub fn copy_tensors(pairs: &[(&Tensor, &Tensor)]) -> Result<()> {
    for (i, (src, dst)) in pairs.iter().enumerate() {
        if src.dtype() != dst.dtype() || src.elem_count() != dst.elem_count() {
            bail!(
                "copy_tensors: pair {i}: source {:?} {:?} and destination {:?} {:?} differ",
                src.dims(),
                src.dtype(),
                dst.dims(),
                dst.dtype()
            );
        }
        if !dst.is_contiguous() {
            bail!("copy_tensors: pair {i}: the destination must be contiguous");
        }
    }
    #[cfg(feature = "cuda")]
    if pairs
        .iter()
        .all(|(s, d)| s.device().is_cuda() && d.device().is_cuda())
    {
        let contiguous: Vec<Tensor> = pairs
            .iter()
            .map(|(src, _)| src.contiguous())
            .collect::<Result<_>>()?;
        let pairs: Vec<(&Tensor, &Tensor)> = contiguous
            .iter()
            .zip(pairs)
            .map(|(s, (_, d))| (s, *d))
            .collect();
        return super::multi_tensor_cuda::copy(&pairs);
    }
    for (src, dst) in pairs {
        let src = src.reshape(dst.shape())?.contiguous()?;
        if dst.rank() == 0 {
            dst.flatten_all()?.slice_set(&src.flatten_all()?, 0, 0)?;
        } else {
            dst.slice_set(&src, 0, 0)?;
        }
    }
    Ok(())
}

/// The hyperparameters of one SGD step (`torch.optim.SGD`'s, a factor on the learning rate,
/// and whether the momentum buffer is still to be initialised). The learning rate itself is a
/// one-element tensor beside the parameters, so that a step captured in a CUDA graph reads
/// each replay's rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdStep {
    /// Multiplies the learning rate (a param group's scale).
    pub lr_scale: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
    pub maximize: bool,
    /// The momentum buffer holds nothing yet: it becomes the gradient.
    pub first_step: bool,
}

impl SgdStep {
    /// The update of one parameter tensor `p` with gradient `g` and momentum buffer `buf`
    /// (views of the flat buffers) at learning rate `lr`: returns the new parameter and the
    /// new buffer.
    fn apply(
        &self,
        lr: f64,
        p: &Tensor,
        g: &Tensor,
        buf: &Tensor,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let mut g = if self.maximize { g.neg()? } else { g.clone() };
        if self.weight_decay != 0.0 {
            g = (g + p.affine(self.weight_decay, 0.0)?)?;
        }
        let mut new_buffer = None;
        if self.momentum != 0.0 {
            let b = if self.first_step {
                g.copy()?
            } else {
                (buf.affine(self.momentum, 0.0)? + g.affine(1.0 - self.dampening, 0.0)?)?
            };
            g = if self.nesterov {
                (g + b.affine(self.momentum, 0.0)?)?
            } else {
                b.clone()
            };
            new_buffer = Some(b);
        }
        Ok((p.sub(&g.affine(lr * self.lr_scale, 0.0)?)?, new_buffer))
    }
}

/// One SGD step of `params` in place: parameter `i`'s gradient and momentum buffer are the
/// elements `offsets[i]..offsets[i] + numel` of the flat `grads` and `momentum_buffer`, and
/// the learning rate is the one element of `lr` (all of the parameters' dtype and device, f32
/// or f64 on CUDA). The momentum buffer is read and written only when `step.momentum != 0`.
pub fn sgd_tensors(
    params: &[&Tensor],
    offsets: &[usize],
    grads: &Tensor,
    momentum_buffer: &Tensor,
    lr: &Tensor,
    step: &SgdStep,
) -> Result<()> {
    if lr.elem_count() != 1 || lr.dtype() != grads.dtype() {
        bail!("sgd_tensors: the learning rate must be one element of the gradients' dtype");
    }
    if params.len() != offsets.len() {
        bail!(
            "sgd_tensors: {} parameters but {} offsets",
            params.len(),
            offsets.len()
        );
    }
    for (i, (p, &offset)) in params.iter().zip(offsets).enumerate() {
        let end = offset + p.elem_count();
        if end > grads.elem_count() || end > momentum_buffer.elem_count() {
            bail!("sgd_tensors: parameter {i} ({offset}..{end}) lies outside the flat buffers");
        }
        if p.dtype() != grads.dtype() || p.dtype() != momentum_buffer.dtype() {
            bail!("sgd_tensors: parameter {i}, gradients and momentum must share one dtype");
        }
        if !p.is_contiguous() {
            bail!("sgd_tensors: parameter {i} must be contiguous");
        }
    }
    #[cfg(feature = "cuda")]
    if grads.device().is_cuda() && matches!(grads.dtype(), DType::F32 | DType::F64) {
        return super::multi_tensor_cuda::sgd(params, offsets, grads, momentum_buffer, lr, step);
    }
    if !matches!(grads.dtype(), DType::F32 | DType::F64) {
        bail!(
            "sgd_tensors: dtype {:?} is not supported (f32, f64)",
            grads.dtype()
        );
    }
    let lr = lr.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?[0];
    for (p, &offset) in params.iter().zip(offsets) {
        let n = p.elem_count();
        let g = grads.narrow(0, offset, n)?.reshape(p.shape())?;
        let buf_view = momentum_buffer.narrow(0, offset, n)?;
        let buf = buf_view.reshape(p.shape())?;
        let (new_p, new_buf) = step.apply(lr, p, &g, &buf)?;
        copy_tensors(&[(&new_p, p)])?;
        if let Some(b) = new_buf {
            copy_tensors(&[(&b, &buf_view)])?;
        }
    }
    Ok(())
}
