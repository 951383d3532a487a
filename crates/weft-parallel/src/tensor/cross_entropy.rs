//! Cross-entropy over logits split by vocabulary across the tensor-parallel group (Megatron's
//! `vocab_parallel_cross_entropy`): no rank ever holds a token's full row of logits. Each
//! rank shifts its block by the group's maximum (a constant: the softmax does not depend on
//! it), g sums the blocks' `Σ exp` and the target logit (found on the one rank holding it), and
//! every rank gets the same loss; the backward of g is the identity, so each rank's logits
//! receive exactly their part of `softmax − one-hot`.

use candle_core::{DType, Tensor, D};
use weft_tensor::{LossOutput, Objective};

use super::mappings::reduce_from_region;
use super::TensorParallelGroup;
use crate::error::Result;

/// `logits` as rows (`[tokens, rows]`, in f32 for 16-bit logits), the columns at or past
/// `vocab_size` (the table's padding) set to -inf.
fn masked_rows(logits: &Tensor, start: usize, vocab_size: usize) -> Result<Tensor> {
    let rows = logits.dim(D::Minus1)?;
    let mut z = logits.reshape(((), rows))?;
    if matches!(z.dtype(), DType::BF16 | DType::F16) {
        z = z.to_dtype(DType::F32)?;
    }
    let valid = vocab_size.saturating_sub(start).min(rows);
    if valid < rows {
        let mask: Vec<f32> = (0..rows)
            .map(|j| if j < valid { 0.0 } else { f32::NEG_INFINITY })
            .collect();
        let mask = Tensor::from_vec(mask, (1, rows), z.device())?.to_dtype(z.dtype())?;
        z = z.broadcast_add(&mask)?;
    }
    Ok(z)
}

/// Mean next-token loss of `logits` (`[.., rows]`, this rank's vocabulary block, its first row
/// being token `start`) against the u32 `targets`; columns at or past `vocab_size` (the padding
/// of the table) take no part. 16-bit logits are computed in f32.
pub fn vocab_parallel_cross_entropy(
    logits: &Tensor,
    targets: &Tensor,
    start: usize,
    vocab_size: usize,
    group: &TensorParallelGroup,
) -> Result<Tensor> {
    let rows = logits.dim(D::Minus1)?;
    let z = masked_rows(logits, start, vocab_size)?;
    let max = group.all_reduce_max(&z.detach().max_keepdim(1)?)?;
    let shifted = z.broadcast_sub(&max)?;
    let sum_exp = reduce_from_region(&shifted.exp()?.sum_keepdim(1)?, group)?;
    let local = targets
        .flatten_all()?
        .to_dtype(DType::I64)?
        .broadcast_sub(&Tensor::new(start as i64, z.device())?)?;
    let held = local.ge(0i64)?.mul(&local.lt(rows as i64)?)?;
    let index = held
        .where_cond(&local, &local.zeros_like()?)?
        .to_dtype(DType::U32)?
        .unsqueeze(1)?;
    let picked = shifted
        .gather(&index, 1)?
        .broadcast_mul(&held.to_dtype(z.dtype())?.unsqueeze(1)?)?;
    let target = reduce_from_region(&picked, group)?;
    Ok((sum_exp.log()? - target)?.mean_all()?)
}

/// [`vocab_parallel_cross_entropy`]'s mean loss and, with no autograd graph, the gradient of
/// `scale × loss` with respect to this rank's block of the logits: `(softmax − one-hot) ·
/// scale / tokens` on the columns it holds (zero in the padding), in the logits' dtype.
pub fn vocab_parallel_cross_entropy_and_grad(
    logits: &Tensor,
    targets: &Tensor,
    start: usize,
    vocab_size: usize,
    group: &TensorParallelGroup,
    scale: f64,
) -> Result<(Tensor, Tensor)> {
    let rows = logits.dim(D::Minus1)?;
    let z = masked_rows(&logits.detach(), start, vocab_size)?;
    let tokens = z.dim(0)?;
    let shifted = z.broadcast_sub(&group.all_reduce_max(&z.max_keepdim(1)?)?)?;
    drop(z);
    let exp = shifted.exp()?;
    let sum_exp = group.all_reduce(&exp.sum_keepdim(1)?)?;
    // Each token's target as a column of this block (outside 0..rows where another rank holds it).
    let local = targets
        .flatten_all()?
        .to_dtype(DType::I64)?
        .broadcast_sub(&Tensor::new(start as i64, shifted.device())?)?
        .unsqueeze(1)?;
    let columns = Tensor::arange(0i64, rows as i64, shifted.device())?.unsqueeze(0)?;
    let one_hot = columns.broadcast_eq(&local)?.to_dtype(shifted.dtype())?;
    // The target's shifted logit where this rank holds it, by selection (the padding's -inf
    // times a zero would be NaN).
    let held = local.ge(0i64)?.mul(&local.lt(rows as i64)?)?;
    let index = held
        .where_cond(&local, &local.zeros_like()?)?
        .to_dtype(DType::U32)?;
    let picked = shifted.gather(&index, 1)?;
    let picked = held.where_cond(&picked, &picked.zeros_like()?)?;
    let target = group.all_reduce(&picked)?;
    drop(shifted);
    let loss = (sum_exp.log()? - target)?.mean_all()?;
    let softmax = exp.broadcast_div(&sum_exp)?;
    drop(exp);
    let grad = ((softmax - one_hot)? * (scale / tokens as f64))?;
    Ok((
        loss,
        grad.to_dtype(logits.dtype())?.reshape(logits.shape())?,
    ))
}

/// Language modelling over vocabulary-parallel logits: [`vocab_parallel_cross_entropy`] as a
/// training step's objective (every rank of the group reports the same loss).
#[derive(Clone)]
pub struct VocabParallelNextToken {
    pub vocab_size: usize,
    /// The first token of this rank's block of the logits.
    pub start: usize,
    pub group: TensorParallelGroup,
}

impl Objective for VocabParallelNextToken {
    fn loss(&self, logits: &Tensor, targets: &Tensor) -> weft_tensor::Result<LossOutput> {
        let loss =
            vocab_parallel_cross_entropy(logits, targets, self.start, self.vocab_size, &self.group)
                .map_err(|e| weft_tensor::TensorError::Block {
                    block: "loss".into(),
                    message: e.to_string(),
                })?;
        Ok(LossOutput {
            loss,
            metrics: Vec::new(),
        })
    }

    fn loss_and_output_grad(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        scale: f64,
    ) -> weft_tensor::Result<Option<(LossOutput, Tensor)>> {
        let (start, vocab, group) = (self.start, self.vocab_size, &self.group);
        let (loss, grad) =
            vocab_parallel_cross_entropy_and_grad(logits, targets, start, vocab, group, scale)
                .map_err(|e| weft_tensor::TensorError::Block {
                    block: "loss".into(),
                    message: e.to_string(),
                })?;
        let output = LossOutput {
            loss,
            metrics: Vec::new(),
        };
        Ok(Some((output, grad)))
    }
}
