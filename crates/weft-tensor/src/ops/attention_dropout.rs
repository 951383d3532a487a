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
//! ([`super::dropout::set_dropout_step`]). A step captured in a CUDA graph keeps the host's part of every seed
//! as it was at the capture; the step value, written before each replay, is what gives a replay
//! new masks. Without it, the fused path refuses to be captured (the step then runs eagerly).

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::{Result, Tensor};

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
    check_probability(dropout)?;
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

/// What the fused attention with dropout keeps for its backward: its output `[B, T, heads · d]`,
/// each query row's log-sum-exp, and the Philox state its masks were drawn from (the backward
/// draws them again from it).
pub struct DroppedAttention {
    pub out: Tensor,
    pub lse: Tensor,
    pub philox: Tensor,
}

/// [`packed_attention_with_dropout`] graph-free, for a block's own backward: the output and
/// what [`packed_causal_attention_with_dropout_backward`] reads; `None` where the fused path
/// does not apply.
pub fn packed_causal_attention_with_dropout(
    qkv: &Tensor,
    heads: PackedHeads,
    dropout: &Dropout,
) -> Result<Option<DroppedAttention>> {
    check_probability(dropout)?;
    #[cfg(feature = "cudnn")]
    if fused_attention_dropout()
        && dropout.p > 0.0
        && super::storage::uses_cuda_kernels_with_half(&[qkv])
    {
        return super::attention_dropout_cuda::forward_saving(qkv, heads, dropout);
    }
    let _ = (qkv, heads);
    Ok(None)
}

/// The gradient of the packed rows `qkv` from the output's gradient `d_out`, the masks drawn
/// again from `saved`'s Philox state, for dropout probability `p`.
pub fn packed_causal_attention_with_dropout_backward(
    qkv: &Tensor,
    saved: &DroppedAttention,
    d_out: &Tensor,
    heads: PackedHeads,
    p: f64,
) -> Result<Tensor> {
    #[cfg(feature = "cudnn")]
    return super::attention_dropout_cuda::backward_saved(qkv, saved, d_out, heads, p);
    #[cfg(not(feature = "cudnn"))]
    {
        let _ = (qkv, saved, d_out, heads, p);
        candle_core::bail!("the fused attention's dropout runs in cuDNN builds only")
    }
}

/// Refuses a probability outside [0, 1).
fn check_probability(dropout: &Dropout) -> Result<()> {
    if !(0.0..1.0).contains(&dropout.p) {
        candle_core::bail!(
            "attention dropout: probability {} is not in [0, 1)",
            dropout.p
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

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
            step: 0,
            placement: None,
        };
        assert!(packed_attention_with_dropout(&qkv, heads, &dropout(0.1))
            .unwrap()
            .is_none());
        for p in [1.0, -0.1, f64::NAN] {
            let err = packed_attention_with_dropout(&qkv, heads, &dropout(p)).unwrap_err();
            assert!(err.to_string().contains("not in [0, 1)"), "{err}");
        }
        super::super::dropout::set_dropout_step(&Device::Cpu, 3).unwrap();
    }
}
