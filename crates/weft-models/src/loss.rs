//! Losses and metrics: mean cross-entropy over a batch, the count of correct top-1
//! predictions, [`Classification`] (the two as a training step's objective) and
//! [`NextToken`], a language model's next-token cross-entropy.

use candle_core::{DType, Tensor, D};
use weft_tensor::{ops, LossOutput, Objective};

/// Mean cross-entropy of `logits` (`N x classes`) against integer `labels` (`N`, u32),
/// computed in f32 for 16-bit logits (softmax and loss in full precision).
pub fn cross_entropy(logits: &Tensor, labels: &Tensor) -> candle_core::Result<Tensor> {
    match logits.dtype() {
        DType::BF16 | DType::F16 => {
            candle_nn::loss::cross_entropy(&logits.to_dtype(DType::F32)?, labels)
        }
        _ => candle_nn::loss::cross_entropy(logits, labels),
    }
}

/// Number of rows whose arg-max equals the label.
pub fn correct_predictions(logits: &Tensor, labels: &Tensor) -> candle_core::Result<usize> {
    let predicted = logits.argmax(D::Minus1)?;
    let hits = predicted.eq(&labels.to_dtype(predicted.dtype())?)?;
    Ok(hits
        .to_dtype(candle_core::DType::U32)?
        .sum_all()?
        .to_scalar::<u32>()? as usize)
}

/// Image classification: mean cross-entropy of the logits against u32 labels, reporting the
/// number of correct top-1 predictions as `correct`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Classification;

impl Objective for Classification {
    fn loss(&self, logits: &Tensor, labels: &Tensor) -> weft_tensor::Result<LossOutput> {
        let loss = cross_entropy(logits, labels)?;
        let predicted = logits.detach().argmax(D::Minus1)?;
        let hits = predicted
            .eq(&labels.to_dtype(predicted.dtype())?)?
            .to_dtype(candle_core::DType::U32)?
            .sum_all()?;
        Ok(LossOutput {
            loss,
            metrics: vec![("correct", hits)],
        })
    }
}

/// Language modelling: the mean cross-entropy of `[B, T, rows]` logits against `[B, T]` u32
/// next tokens, over the first `vocab_size` columns only (the rows a padded embedding table
/// adds are masked out before the softmax), in f32 for 16-bit logits; fused
/// ([`weft_tensor::ops::cross_entropy_rows`]).
#[derive(Debug, Clone, Copy)]
pub struct NextToken {
    pub vocab_size: usize,
}

impl Objective for NextToken {
    fn loss(&self, logits: &Tensor, targets: &Tensor) -> weft_tensor::Result<LossOutput> {
        let rows = logits.dim(D::Minus1)?;
        if rows < self.vocab_size {
            return Err(weft_tensor::TensorError::Block {
                block: "loss".into(),
                message: format!(
                    "{rows} logits per token for a vocabulary of {}",
                    self.vocab_size
                ),
            });
        }
        let flat = logits.reshape(((), rows))?;
        let losses = ops::cross_entropy_rows(&flat, &targets.flatten_all()?, self.vocab_size)?;
        let loss = losses.mean_all()?;
        Ok(LossOutput {
            loss,
            metrics: Vec::new(),
        })
    }
}
