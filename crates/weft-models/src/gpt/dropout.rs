//! The GPT's dropout sites: where in a block a dropout sits (part of its masks' seed), each
//! site's [`Dropout`] for a forward in a [`Mode`], and the mode's seeds kept among a block's
//! saved tensors, so that its own backward drops the gradient with the forward's masks.

use candle_core::{DType, Device, Tensor};
use weft_tensor::ops::dropout::{derive_seed, name_seed, Dropout, Placement};
use weft_tensor::{ops, Mode, Result, TensorError};

/// Where in a block a dropout sits.
#[derive(Debug, Clone, Copy)]
pub(super) enum Site {
    Embeddings = 1,
    AttentionWeights,
    AttentionOutput,
    MlpOutput,
}

/// The dropout of `site` in block `block` for a forward in `mode`, at probability `p`;
/// `placement` says where a split tensor (a rank's attention heads) sits in the whole one.
pub(super) fn site_dropout(
    p: f64,
    mode: Mode,
    (block, site): (&str, Site),
    placement: Option<Placement>,
) -> Dropout {
    Dropout {
        p,
        seed: derive_seed(
            derive_seed(mode.dropout_seed, name_seed(block)),
            site as u64,
        ),
        step: mode.dropout_step,
        placement,
    }
}

/// Drops values with probability `p` while training (inverted dropout, masks from the mode's
/// seeds, the block and the site: every rank holding the whole activation drops the same
/// elements); identity otherwise.
pub(super) fn dropout(x: Tensor, p: f64, mode: Mode, block: &str, site: Site) -> Result<Tensor> {
    if !(mode.train && p > 0.0) {
        return Ok(x);
    }
    ops::dropout::dropout(&x, &site_dropout(p, mode, (block, site), None))
}

/// `mode`'s dropout seeds as a tensor kept with a block's saved tensors (on the host).
pub(super) fn saved_seeds(mode: Mode) -> Result<Tensor> {
    let seeds = [mode.dropout_seed, mode.dropout_step].map(|s| s as i64);
    Ok(Tensor::from_vec(seeds.to_vec(), 2, &Device::Cpu)?)
}

/// The training mode whose seeds [`saved_seeds`] kept.
pub(super) fn mode_of(seeds: &Tensor, block: &str) -> Result<Mode> {
    let seeds = match seeds.dtype() {
        DType::I64 => seeds.to_vec1::<i64>()?,
        _ => Vec::new(),
    };
    let [seed, step] = seeds[..] else {
        return Err(TensorError::Block {
            block: block.into(),
            message: "its backward got no dropout seeds".into(),
        });
    };
    Ok(Mode::TRAIN
        .with_dropout_seed(seed as u64)
        .with_dropout_step(step as u64))
}
