//! [`packed_attention`]: the causal attention of a packed q | k | v projection
//! ([`super::packed_causal_attention`]: cuDNN's fused flash attention on 16-bit GPU data) as an
//! op of Candle's autograd, for blocks Candle differentiates (the Llama's). The forward runs
//! graph-free and keeps each query row's log-sum-exp; its output enters the graph through an
//! op whose backward is [`super::packed_causal_attention_backward`] (the output is copied once
//! on the way in: Candle's custom ops return storage of their own). [`attended`] enters any
//! graph-free attention's output with its own backward (the fused one with dropout).

use std::sync::Mutex;

use candle_core::backend::BackendStorage;
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, CustomOp1, Layout, Result, Shape, Storage, Tensor};

use super::packed_attention::{
    packed_causal_attention, packed_causal_attention_backward, PackedHeads,
};

/// `[B, T, heads · d]`, the attention of `qkv` (`[B, T, (heads + 2 kv_heads) · d]`),
/// differentiable with respect to `qkv`.
pub fn packed_attention(qkv: &Tensor, heads: PackedHeads) -> Result<Tensor> {
    let (out, lse) = packed_causal_attention(&qkv.detach(), heads)?;
    let backward = move |qkv: &Tensor, out: &Tensor, d_out: &Tensor| {
        packed_causal_attention_backward(qkv, out, &lse, d_out, heads)
    };
    attended(qkv, out, Box::new(backward))
}

/// The gradient of `qkv` from `qkv`, the output and the output's gradient.
pub(crate) type AttentionBackward =
    Box<dyn Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor> + Send + Sync>;

/// `out`, an attention of `qkv` computed graph-free, as a function of `qkv` in Candle's graph
/// (when `qkv` is in one), its gradient given by `backward`.
pub(crate) fn attended(qkv: &Tensor, out: Tensor, backward: AttentionBackward) -> Result<Tensor> {
    if !qkv.track_op() {
        return Ok(out);
    }
    let whole = out.layout().is_contiguous() && out.layout().start_offset() == 0;
    let out = if whole { out } else { out.copy()? };
    qkv.apply_op1(Attended {
        out: Mutex::new(Some(out)),
        backward,
    })
}

/// The forward's output (handed over once) and the attention's backward.
struct Attended {
    out: Mutex<Option<Tensor>>,
    backward: AttentionBackward,
}

impl Attended {
    /// The output, taken: the graph keeps the copy this op returns.
    fn take(&self) -> Result<Tensor> {
        let mut slot = self
            .out
            .lock()
            .map_err(|_| candle_core::Error::Msg("poisoned".into()))?;
        match slot.take() {
            Some(out) => Ok(out),
            None => bail!("packed_attention: the forward ran twice"),
        }
    }
}

impl CustomOp1 for Attended {
    fn name(&self) -> &'static str {
        "packed_attention"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = self.take()?;
        let (storage, layout) = out.storage_and_layout();
        match &*storage {
            Storage::Cpu(s) => Ok((s.try_clone(layout)?, out.shape().clone())),
            _ => bail!("packed_attention: the output left the CPU"),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, _: &CudaStorage, _: &Layout) -> Result<(CudaStorage, Shape)> {
        let out = self.take()?;
        let (storage, layout) = out.storage_and_layout();
        match &*storage {
            Storage::Cuda(s) => Ok((s.try_clone(layout)?, out.shape().clone())),
            _ => bail!("packed_attention: the output left the GPU"),
        }
    }

    fn bwd(&self, qkv: &Tensor, out: &Tensor, d_out: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some((self.backward)(qkv, out, d_out)?))
    }
}
