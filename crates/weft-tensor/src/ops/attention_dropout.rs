//! Dropout of the attention weights drawn inside cuDNN's fused flash attention (16-bit data on a
//! GPU, feature `cudnn`), so that attention with dropout never materialises the `T × T`
//! weights. cuDNN draws the mask itself, from its Philox generator keyed by a seed in device
//! memory; the backward draws the same mask again from the same seed.
//!
//! Those masks are cuDNN's, not [`super::dropout`]'s position-derived ones: the fused path
//! agrees with the unfused one (and with other layouts of the model) in distribution, not bit
//! for bit. Each call's seed mixes the host's seed for the site (the block, the site, the step
//! and micro-batch as [`super::dropout::Dropout::seed`] carries them, and the first head a
//! tensor-parallel rank holds) with a per-device step value in device memory
//! ([`set_dropout_step`]). A step captured in a CUDA graph keeps the host's part of every seed
//! as it was at the capture; the step value, written before each replay, is what gives a replay
//! new masks. Without it, the fused path refuses to be captured (the step then runs eagerly).

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::{Device, Result, Tensor};

use super::dropout::Dropout;
use super::packed_attention::PackedHeads;

static FUSED: AtomicBool = AtomicBool::new(true);

/// Turns the fused path's dropout on (the default) or off (attention with dropout then takes
/// the unfused reference path everywhere: for comparisons and benchmarks).
pub fn set_fused_attention_dropout(on: bool) {
    FUSED.store(on, Ordering::Relaxed);
}

/// Whether attention with dropout may take cuDNN's fused path ([`set_fused_attention_dropout`]).
pub fn fused_attention_dropout() -> bool {
    FUSED.load(Ordering::Relaxed)
}

/// Writes `step` into `device`'s step value, stream-ordered before the work queued after it:
/// call it before each training step (eagerly run or replayed from a CUDA graph) with a value
/// that changes every step (the step's dropout seed). Nothing on the CPU.
pub fn set_dropout_step(device: &Device, step: u64) -> Result<()> {
    #[cfg(feature = "cudnn")]
    if let Device::Cuda(cuda) = device {
        return super::attention_dropout_cuda::set_step(cuda, step);
    }
    let _ = (device, step);
    Ok(())
}

/// The causal attention of the packed rows `qkv` (`[B, T, (heads + 2 kv_heads) · d]`) with
/// `dropout` of its weights drawn inside cuDNN's fused attention, differentiable with respect
/// to `qkv`: `[B, T, heads · d]`. `None` where the fused path does not apply (not 16-bit data on
/// a GPU, a build without cuDNN, no cuDNN engine for the geometry, [`set_fused_attention_dropout`]
/// off): the caller then takes its own path. `dropout.placement`'s offset (the first head of a
/// tensor-parallel rank) enters the seed, so that ranks draw distinct masks.
pub fn packed_attention_with_dropout(
    qkv: &Tensor,
    heads: PackedHeads,
    dropout: &Dropout,
) -> Result<Option<Tensor>> {
    if !(0.0..1.0).contains(&dropout.p) {
        candle_core::bail!(
            "attention dropout: probability {} is not in [0, 1)",
            dropout.p
        );
    }
    #[cfg(feature = "cudnn")]
    if fused_attention_dropout()
        && dropout.p > 0.0
        && super::storage::uses_cuda_kernels_with_half(&[qkv])
    {
        return super::attention_dropout_cuda::packed_attention(qkv, heads, dropout);
    }
    let _ = (qkv, heads);
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the CPU the fused path does not apply (the caller takes its own path, with the
    /// position-derived masks); a probability outside [0, 1) is refused; the step value is
    /// nothing to the CPU.
    #[test]
    fn the_cpu_takes_the_callers_path_and_bad_probabilities_are_refused() {
        let heads = PackedHeads {
            heads: 2,
            kv_heads: 2,
            head_dim: 4,
        };
        let qkv = Tensor::zeros(
            (1, 3, heads.row_width()),
            candle_core::DType::F32,
            &Device::Cpu,
        )
        .unwrap();
        let dropout = |p| Dropout {
            p,
            seed: 1,
            placement: None,
        };
        assert!(packed_attention_with_dropout(&qkv, heads, &dropout(0.1))
            .unwrap()
            .is_none());
        for p in [1.0, -0.1, f64::NAN] {
            let err = packed_attention_with_dropout(&qkv, heads, &dropout(p)).unwrap_err();
            assert!(err.to_string().contains("not in [0, 1)"), "{err}");
        }
        set_dropout_step(&Device::Cpu, 3).unwrap();
    }
}
