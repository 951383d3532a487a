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
        Ok(LossOutput {
            loss: cross_entropy(logits, labels)?,
            metrics: vec![("correct", hits(logits, labels)?)],
        })
    }

    /// The fused cross-entropy's two passes with no graph
    /// ([`ops::cross_entropy_rows_and_grad`]): the mean loss, `(softmax − one-hot) · scale / N`
    /// as the logits' gradient (bf16 for bf16 logits on a GPU, f32 for other 16-bit logits),
    /// and the correct predictions (counted by the forward pass, in its dtype).
    fn loss_and_output_grad(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        scale: f64,
    ) -> weft_tensor::Result<Option<(LossOutput, Tensor)>> {
        let (rows, classes) = logits.dims2()?;
        let fused = ops::cross_entropy_rows_and_grad(logits, labels, classes, scale / rows as f64)?;
        let Some(fused) = fused else {
            return Ok(None);
        };
        let loss = LossOutput {
            loss: fused.losses()?.mean_all()?,
            metrics: vec![("correct", fused.hits()?.sum_all()?)],
        };
        Ok(Some((loss, fused.grad)))
    }
}

/// The number of rows whose arg-max equals the label (u32, on the logits' device).
fn hits(logits: &Tensor, labels: &Tensor) -> candle_core::Result<Tensor> {
    let predicted = logits.detach().argmax(D::Minus1)?;
    predicted
        .eq(&labels.to_dtype(predicted.dtype())?)?
        .to_dtype(DType::U32)?
        .sum_all()
}

/// Language modelling: the mean cross-entropy of `[B, T, rows]` logits against `[B, T]` u32
/// next tokens, over the first `vocab_size` columns only (the rows a padded embedding table
/// adds are masked out before the softmax), in f32 for 16-bit logits; fused
/// ([`weft_tensor::ops::cross_entropy_rows`]).
#[derive(Debug, Clone, Copy)]
pub struct NextToken {
    pub vocab_size: usize,
}

impl NextToken {
    /// The logits' row width, checked against the vocabulary.
    fn rows(&self, logits: &Tensor) -> weft_tensor::Result<usize> {
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
        Ok(rows)
    }
}

impl Objective for NextToken {
    fn loss(&self, logits: &Tensor, targets: &Tensor) -> weft_tensor::Result<LossOutput> {
        let rows = self.rows(logits)?;
        let flat = logits.reshape(((), rows))?;
        let losses = ops::cross_entropy_rows(&flat, &targets.flatten_all()?, self.vocab_size)?;
        let loss = losses.mean_all()?;
        Ok(LossOutput {
            loss,
            metrics: Vec::new(),
        })
    }

    /// The fused kernel's two passes with no graph: the mean loss, and `(softmax − one-hot) ·
    /// scale / tokens` as the logits' gradient (zero in the padded columns).
    fn loss_and_output_grad(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        scale: f64,
    ) -> weft_tensor::Result<Option<(LossOutput, Tensor)>> {
        let rows = self.rows(logits)?;
        let flat = logits.reshape(((), rows))?;
        let tokens = flat.dim(0)?;
        let fused = ops::cross_entropy_rows_and_grad(
            &flat,
            &targets.flatten_all()?,
            self.vocab_size,
            scale / tokens as f64,
        )?;
        let Some(fused) = fused else {
            return Ok(None);
        };
        let loss = LossOutput {
            loss: fused.losses()?.mean_all()?,
            metrics: Vec::new(),
        };
        Ok(Some((loss, fused.grad.reshape(logits.shape())?)))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor, Var};
    use weft_tensor::Objective;

    use super::{Classification, NextToken};

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    }

    /// Logits in f64 for the tests, `rows x columns` (any shape of that many elements).
    fn test_logits(shape: &[usize]) -> Var {
        let n: usize = shape.iter().product();
        let values: Vec<f64> = (0..n)
            .map(|i| ((i * 37 % 23) as f64 - 11.0) / 4.0)
            .collect();
        Var::from_tensor(&Tensor::from_vec(values, shape, &Device::Cpu).unwrap()).unwrap()
    }

    /// Autograd's gradient of `scale × loss` with respect to `logits`.
    fn autograd_grad(loss: &Tensor, logits: &Var, scale: f64) -> Tensor {
        (loss * scale)
            .unwrap()
            .backward()
            .unwrap()
            .get(logits.as_tensor())
            .unwrap()
            .clone()
    }

    /// The direct gradient is autograd's of `scale × loss` in f64 within 1e-15 — the padded
    /// columns' zero included — and the loss is the same.
    #[test]
    fn next_token_output_grad_is_the_scaled_loss_gradient() {
        let logits = test_logits(&[2, 3, 8]);
        let targets = Tensor::from_vec(vec![0u32, 5, 2, 6, 1, 3], (2, 3), &Device::Cpu).unwrap();
        let objective = NextToken { vocab_size: 7 };
        let scale = 1024.0 * 0.25;
        let reference = objective.loss(logits.as_tensor(), &targets).unwrap().loss;
        let expected = autograd_grad(&reference, &logits, scale);
        let (output, grad) = objective
            .loss_and_output_grad(logits.as_tensor(), &targets, scale)
            .unwrap()
            .expect("the fused kernels run on the CPU in f64");
        assert_eq!(grad.dims(), [2, 3, 8]);
        assert!(
            max_diff(&grad, &expected) < 1e-15,
            "{}",
            max_diff(&grad, &expected)
        );
        let padded = grad.narrow(2, 7, 1).unwrap();
        assert_eq!(max_diff(&padded, &padded.zeros_like().unwrap()), 0.0);
        assert!(max_diff(&output.loss, &reference) < 1e-15);
        assert_eq!(grad.dtype(), DType::F64);
    }

    /// Classification's direct gradient is autograd's of `scale × loss` (Candle's
    /// cross-entropy) in f64 within 1e-15 relative to `scale` (the two sum the softmax in
    /// different orders), with the same loss and count of correct rows.
    #[test]
    fn classification_output_grad_is_the_scaled_loss_gradient() {
        let logits = test_logits(&[4, 5]);
        let labels = Tensor::from_vec(vec![0u32, 4, 2, 3], 4, &Device::Cpu).unwrap();
        let scale = 1024.0 * 0.5;
        let reference = Classification.loss(logits.as_tensor(), &labels).unwrap();
        let expected = autograd_grad(&reference.loss, &logits, scale);
        let (output, grad) = Classification
            .loss_and_output_grad(logits.as_tensor(), &labels, scale)
            .unwrap()
            .expect("the fused kernels run on the CPU in f64");
        assert!(
            max_diff(&grad, &expected) < 1e-15 * scale,
            "{}",
            max_diff(&grad, &expected)
        );
        assert!(max_diff(&output.loss, &reference.loss) < 1e-15);
        let correct = |o: &weft_tensor::LossOutput| {
            let count = &o.metrics[0].1;
            count
                .to_dtype(DType::F64)
                .unwrap()
                .to_scalar::<f64>()
                .unwrap()
        };
        assert_eq!(correct(&output), correct(&reference));
    }
}
