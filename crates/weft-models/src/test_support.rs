//! What the transformer models' tests share: token batches, gradients against finite
//! differences, and the block-wise tape's gradients against the whole graph's.

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor};
use weft_tensor::{tape, BlockModel, Checkpointing, Mode, Objective, TensorError};

use crate::loss::NextToken;

/// `[b, t]` token ids below `vocab`, varied by `seed`.
pub(crate) fn tokens(b: usize, t: usize, vocab: u32, seed: u32) -> Tensor {
    let v: Vec<u32> = (0..(b * t) as u32)
        .map(|i| (i * 7 + seed * 3 + i * i) % vocab)
        .collect();
    Tensor::from_vec(v, (b, t), &Device::Cpu).unwrap()
}

/// The block-wise backward of the next-token loss (each block's graph cut at its input, the
/// tied table's parts summed), with the blocks kept and recomputed, gives `reference` (the
/// whole graph's gradients, in f64) for every parameter up to summation order: 1e-12.
pub(crate) fn assert_tape_matches(
    model: &BlockModel,
    (ids, targets): (&Tensor, &Tensor),
    vocab_size: usize,
    mode: Mode,
    reference: &GradStore,
) {
    for checkpointing in [Checkpointing::None, Checkpointing::All] {
        let tape = tape::forward(model, ids, mode, &checkpointing).unwrap();
        let out = NextToken { vocab_size }
            .loss(tape.output(), targets)
            .unwrap();
        let mut seen = 0;
        tape.backward(&out.loss, model, |ready| {
            for (id, grad) in ready.grads {
                let entry = &model.store().entries()[id];
                let expected = reference.get(entry.tensor()).unwrap();
                let diff = (grad.unwrap() - expected)
                    .and_then(|d| d.abs()?.max_all()?.to_scalar::<f64>())
                    .map_err(TensorError::from)?;
                assert!(diff < 1e-12, "{}: {diff}", entry.name);
                seen += 1;
            }
            Ok::<(), TensorError>(())
        })
        .unwrap();
        assert_eq!(seen, model.store().parameter_ids().len());
    }
}

/// Gradients of `loss` (a function of the model's current values) against the five-point
/// central differences in f64, for a few values of every parameter: step h = 1e-4 (truncation
/// O(h⁴) ≈ 1e-16 times the fifth derivative, rounding near 1e-11 for losses of order 1), bound
/// 1e-8 relative to max(|g|, 1e-2).
pub(crate) fn assert_gradients_match_finite_differences(
    model: &BlockModel,
    loss: impl Fn(&BlockModel) -> Tensor,
) {
    let grads = loss(model).backward().unwrap();
    let h = 1e-4;
    for entry in model.store().entries() {
        let grad: Vec<f64> = grads
            .get(entry.tensor())
            .expect("every parameter has a gradient")
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let n = grad.len();
        for k in [0, n / 3, n / 2, n - 1] {
            let original: Vec<f64> = entry.tensor().flatten_all().unwrap().to_vec1().unwrap();
            let set = |values: Vec<f64>| {
                let value = Tensor::from_vec(values, entry.var.shape(), &Device::Cpu).unwrap();
                entry.var.set(&value).unwrap();
            };
            let at = |delta: f64| {
                let mut v = original.clone();
                v[k] += delta;
                set(v);
                loss(model).to_scalar::<f64>().unwrap()
            };
            let numeric = (8.0 * (at(h) - at(-h)) - (at(2.0 * h) - at(-2.0 * h))) / (12.0 * h);
            set(original);
            let scale = grad[k].abs().max(1e-2);
            assert!(
                (numeric - grad[k]).abs() / scale < 1e-8,
                "{}[{k}]: analytic {} vs numeric {numeric}",
                entry.name,
                grad[k]
            );
        }
    }
}
