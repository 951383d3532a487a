//! What the transformer models' tests share: token batches and the check of the block-wise
//! tape's gradients against the whole graph's.

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
