//! Classification loss and metrics: mean cross-entropy over a batch and the count of correct
//! top-1 predictions.

use candle_core::{Tensor, D};

/// Mean cross-entropy of `logits` (`N x classes`) against integer `labels` (`N`, u32).
pub fn cross_entropy(logits: &Tensor, labels: &Tensor) -> candle_core::Result<Tensor> {
    candle_nn::loss::cross_entropy(logits, labels)
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
