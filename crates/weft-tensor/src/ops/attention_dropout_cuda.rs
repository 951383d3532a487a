//! The GPU side of [`super::attention_dropout`]: each call's Philox state computed on the
//! device from the device's dropout step value (`super::dropout_cuda`; the kernel
//! `attention_dropout_philox`: no host copy, so a CUDA graph can capture it), and the fused
//! forward with dropout entered into Candle's graph with its fused backward, which reads the
//! same state.

use candle_core::cuda::CudaDevice;
use candle_core::{bail, Result, Shape, Tensor};
use cudarc::driver::{CudaSlice, DevicePtr, PushKernelArg};

use super::attention_dropout::DroppedAttention;
use super::cuda_launch::{function_named, launched, ATTENTION_DROPOUT};
use super::dropout::{derive_seed, Dropout};
use super::dropout_cuda::{live_step, ONE_THREAD};
use super::packed_attention::PackedHeads;
use super::packed_attention_grad::attended;
use super::sdpa_cudnn::{backward, forward, FusedDropout};
use super::sdpa_support::wrap;

/// The Philox state (four i64: the seed at 0, the offset at 2) of one fused forward at `site`.
/// Inside a capture only once the step value has been written, else an error: the replays
/// would all draw the capture's masks.
fn philox_state(device: &CudaDevice, site: u64) -> Result<Tensor> {
    let step = live_step(device)?;
    // SAFETY: the kernel writes all four elements.
    let state: CudaSlice<i64> = unsafe { device.alloc::<i64>(4)? };
    let (state_at, _) = state.device_ptr(&device.cuda_stream());
    let func = function_named(device, &ATTENTION_DROPOUT, "attention_dropout_philox")?;
    let mut builder = func.builder();
    builder.arg(&step).arg(&site).arg(&state_at);
    // SAFETY: the arguments match `attention_dropout_philox`; `step` is this device's live step
    // value and `state_at` the four i64 allocated above, on the compute stream in order.
    launched("attention_dropout_philox", unsafe {
        builder.launch(ONE_THREAD)
    })?;
    Ok(wrap(state, device, Shape::from(4)))
}

/// [`super::attention_dropout::packed_attention_with_dropout`] on 16-bit GPU data.
pub(crate) fn packed_attention(
    qkv: &Tensor,
    heads: PackedHeads,
    dropout: &Dropout,
) -> Result<Option<Tensor>> {
    let Some(DroppedAttention { out, lse, philox }) = forward_saving(qkv, heads, dropout)? else {
        return Ok(None);
    };
    let p = dropout.p;
    let backward = move |qkv: &Tensor, out: &Tensor, d_out: &Tensor| {
        let saved = DroppedAttention {
            out: out.clone(),
            lse: lse.clone(),
            philox: philox.clone(),
        };
        backward_saved(qkv, &saved, d_out, heads, p)
    };
    Ok(Some(attended(qkv, out, Box::new(backward))?))
}

/// [`super::attention_dropout::packed_causal_attention_with_dropout`] on 16-bit GPU data.
pub(crate) fn forward_saving(
    qkv: &Tensor,
    heads: PackedHeads,
    dropout: &Dropout,
) -> Result<Option<DroppedAttention>> {
    heads.check(qkv)?;
    let device = qkv.device().as_cuda_device()?;
    let first_head = dropout.placement.map_or(0, |p| p.offset as u64);
    let philox = philox_state(device, derive_seed(dropout.seed, first_head))?;
    let fused = FusedDropout {
        p: dropout.p,
        philox: &philox,
    };
    let Some((out, lse)) = forward(&qkv.detach().contiguous()?, heads, Some(fused))? else {
        return Ok(None);
    };
    Ok(Some(DroppedAttention { out, lse, philox }))
}

/// [`super::attention_dropout::packed_causal_attention_with_dropout_backward`] on a GPU.
pub(crate) fn backward_saved(
    qkv: &Tensor,
    saved: &DroppedAttention,
    d_out: &Tensor,
    heads: PackedHeads,
    p: f64,
) -> Result<Tensor> {
    let fused = FusedDropout {
        p,
        philox: &saved.philox,
    };
    let (qkv, out, d_out) = (
        qkv.contiguous()?,
        saved.out.contiguous()?,
        d_out.contiguous()?,
    );
    match backward(&qkv, &out, &saved.lse, &d_out, heads, Some(fused))? {
        Some(d_qkv) => Ok(d_qkv),
        None => bail!(
            "cuDNN's fused attention backward with dropout did not run for {heads:?} \
             (its plan was made with the forward; was determinism switched in between?)"
        ),
    }
}
