//! The head's own backward ([`ExplicitBackward`]): the final LayerNorm and the product with the
//! token table, run graph-free. It keeps the LayerNorm's input and output (`[B·T, width]`
//! each), not the logits, so the logits (a language model's largest tensor) go as soon as the
//! loss's gradient exists; backward multiplies the logits' gradient by the table and by the
//! normalised rows, each gradient computed once. With the table's rows split over ranks
//! (vocabulary parallelism) the input's gradient is summed over them, as Megatron's f.

use candle_core::Tensor;
use weft_tensor::{ops, ExplicitBackward, ExplicitGrads, Mode, Result, Saved, TensorError};

use super::blocks::Head;

impl ExplicitBackward for Head {
    fn forward_saving(&self, x: &Tensor, _mode: Mode) -> Result<Option<(Tensor, Saved)>> {
        let Some(projection) = self.wte.head_projection() else {
            return Ok(None);
        };
        let (b, t, c) = x.dims3()?;
        let h = x.reshape((b * t, c))?.contiguous()?;
        let (w, bias) = (self.ln_f.weight().detach(), self.ln_f.bias().detach());
        let normed = ops::layer_norm(&h, &w, &bias, self.ln_f.eps())?;
        let logits = ops::project(&normed, &projection.table.detach().t()?)?;
        Ok(Some((logits.reshape((b, t, ()))?, vec![h, normed])))
    }

    fn backward(&self, saved: Saved, dy: &Tensor, input_grad: bool) -> Result<ExplicitGrads> {
        let projection = self
            .wte
            .head_projection()
            .expect("forward_saving kept tensors only for a table product");
        let [h, normed]: [Tensor; 2] = saved.try_into().map_err(|_| TensorError::Block {
            block: "head".into(),
            message: "its backward got the wrong saved tensors".into(),
        })?;
        let (b, t, rows) = dy.dims3()?;
        let d_logits = dy.reshape((b * t, rows))?.contiguous()?;
        let mut d_normed = d_logits.matmul(&projection.table.detach())?;
        if let Some(sum) = projection.input_grad_sum {
            d_normed = sum.sum(&d_normed)?;
        }
        let d_table = d_logits.t()?.matmul(&normed)?;
        let (w, bias) = (self.ln_f.weight().detach(), self.ln_f.bias().detach());
        let (d_h, d_w, d_b) = ops::layer_norm_backward(&h, &w, &bias, &d_normed, self.ln_f.eps())?;
        let input = match input_grad {
            true => Some(d_h.reshape((b, t, h.dim(1)?))?),
            false => None,
        };
        let params = vec![
            (self.ln_f.weight().id(), d_w),
            (self.ln_f.bias().id(), d_b),
            (projection.table.id(), d_table),
        ];
        Ok(ExplicitGrads { input, params })
    }
}
