//! The GPU side of [`super::attention_dropout`]: each device's step value in device memory
//! (written by `kernels/attention_dropout.cu`'s `attention_dropout_step`), each call's Philox
//! state computed on the device from it (`attention_dropout_philox`: no host copy, so a CUDA
//! graph can capture it), and the fused forward with dropout entered into Candle's graph with
//! its fused backward, which reads the same state.

use std::cell::RefCell;
use std::collections::HashMap;

use candle_core::cuda::CudaDevice;
use candle_core::cuda_backend::DeviceId;
use candle_core::{bail, Result, Shape, Tensor};
use cudarc::driver::sys::CUstreamCaptureStatus;
use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};

use super::cuda_launch::{function_named, launched, ATTENTION_DROPOUT};
use super::dropout::{derive_seed, Dropout};
use super::packed_attention::PackedHeads;
use super::packed_attention_grad::attended;
use super::sdpa_cudnn::{backward, forward, FusedDropout};
use super::sdpa_support::wrap;

/// A device's step value, and whether anyone has written it (a captured step needs that).
struct StepValue {
    cell: CudaSlice<u64>,
    written: bool,
}

thread_local! {
    static STEPS: RefCell<HashMap<DeviceId, StepValue>> = RefCell::new(HashMap::new());
}

const ONE_THREAD: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (1, 1, 1),
    shared_mem_bytes: 0,
};

/// Whether `device`'s stream is capturing a CUDA graph.
fn capturing(device: &CudaDevice) -> Result<bool> {
    let status = device
        .cuda_stream()
        .capture_status()
        .map_err(|e| candle_core::Error::Msg(format!("capture status: {e:?}")))?;
    Ok(status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// The address of `device`'s step value, made (zero) on first use outside a capture.
fn step_address(device: &CudaDevice, write: bool) -> Result<u64> {
    STEPS.with(|steps| {
        let mut steps = steps.borrow_mut();
        if let Some(step) = steps.get_mut(&device.id()) {
            step.written |= write;
            let (at, _) = step.cell.device_ptr(&device.cuda_stream());
            return Ok(at);
        }
        if capturing(device)? {
            bail!(
                "attention dropout in a CUDA graph: the step's dropout value was never written \
                 (ops::set_dropout_step before each step), so every replay would draw the same \
                 masks"
            );
        }
        let cell = device.alloc_zeros::<u64>(1)?;
        let (at, _) = cell.device_ptr(&device.cuda_stream());
        steps.insert(
            device.id(),
            StepValue {
                cell,
                written: write,
            },
        );
        Ok(at)
    })
}

/// [`super::attention_dropout::set_dropout_step`] on a GPU.
pub(crate) fn set_step(device: &CudaDevice, value: u64) -> Result<()> {
    let at = step_address(device, true)?;
    let func = function_named(device, &ATTENTION_DROPOUT, "attention_dropout_step")?;
    let mut builder = func.builder();
    builder.arg(&at).arg(&value);
    // SAFETY: the arguments match `attention_dropout_step`; `at` is this device's live step
    // value (one u64), written on the compute stream in order.
    launched("attention_dropout_step", unsafe {
        builder.launch(ONE_THREAD)
    })
}

/// The Philox state (four i64: the seed at 0, the offset at 2) of one fused forward at `site`.
/// Inside a capture only once the step value has been written, else an error: the replays
/// would all draw the capture's masks.
fn philox_state(device: &CudaDevice, site: u64) -> Result<Tensor> {
    let step = step_address(device, false)?;
    let written = STEPS.with(|s| s.borrow().get(&device.id()).is_some_and(|s| s.written));
    if !written && capturing(device)? {
        bail!(
            "attention dropout in a CUDA graph needs ops::set_dropout_step before each replay \
             (else every replay draws the same masks)"
        );
    }
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
    heads.check(qkv)?;
    let device = qkv.device().as_cuda_device()?;
    let first_head = dropout.placement.map_or(0, |p| p.offset as u64);
    let philox = philox_state(device, derive_seed(dropout.seed, first_head))?;
    let p = dropout.p;
    let fused = FusedDropout { p, philox: &philox };
    let Some((out, lse)) = forward(&qkv.detach().contiguous()?, heads, Some(fused))? else {
        return Ok(None);
    };
    let backward = move |qkv: &Tensor, out: &Tensor, d_out: &Tensor| {
        let fused = FusedDropout { p, philox: &philox };
        let (qkv, out, d_out) = (qkv.contiguous()?, out.contiguous()?, d_out.contiguous()?);
        match backward(&qkv, &out, &lse, &d_out, heads, Some(fused))? {
            Some(d_qkv) => Ok(d_qkv),
            None => bail!(
                "cuDNN's fused attention backward with dropout did not run for {heads:?} \
                 (its plan was made with the forward; was determinism switched in between?)"
            ),
        }
    };
    Ok(Some(attended(qkv, out, Box::new(backward))?))
}
