//! The GPU side of [`super::dropout`]: each device's step value in device memory (written by
//! `kernels/dropout.cu`'s `dropout_step`, read by every dropout on the device — the
//! position-derived masks of `dropout_apply` and the Philox seeds of the attention dropout
//! inside cuDNN), and the dropout kernel itself, entered into Candle's graph with the same
//! dropout of the gradient as its backward.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use candle_core::cuda::{CudaDType, CudaDevice, CudaStorage};
use candle_core::cuda_backend::DeviceId;
use candle_core::{bail, CustomOp1, DType, Layout, Result, Shape, Tensor, WithDType};
use cudarc::driver::sys::CUstreamCaptureStatus;
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use half::{bf16, f16};

use super::cuda_launch::{
    device_of, function, function_named, grid_stride, launched, output, view, DROPOUT,
};
use super::dropout::Dropout;

/// A device's step value, and whether anyone has written it (a captured step needs that).
struct StepValue {
    cell: CudaSlice<u64>,
    written: bool,
}

/// Every device's step value (one process may drive several devices, from several threads).
static STEPS: Mutex<Option<HashMap<DeviceId, StepValue>>> = Mutex::new(None);

fn steps() -> MutexGuard<'static, Option<HashMap<DeviceId, StepValue>>> {
    // A panic while holding the lock leaves a map that is still whole.
    STEPS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One thread: the step value's writer and the attention dropout's Philox state.
pub(crate) const ONE_THREAD: LaunchConfig = LaunchConfig {
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
    let mut steps = steps();
    let steps = steps.get_or_insert_with(HashMap::new);
    if let Some(step) = steps.get_mut(&device.id()) {
        step.written |= write;
        let (at, _) = step.cell.device_ptr(&device.cuda_stream());
        return Ok(at);
    }
    if capturing(device)? {
        bail!(
            "dropout in a CUDA graph: the step's dropout value was never written \
             (ops::set_dropout_step before each step), so every replay would draw the same masks"
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
}

/// [`super::dropout::set_dropout_step`] on a GPU.
pub(crate) fn set_step(device: &CudaDevice, value: u64) -> Result<()> {
    let at = step_address(device, true)?;
    let func = function_named(device, &DROPOUT, "dropout_step")?;
    let mut builder = func.builder();
    builder.arg(&at).arg(&value);
    // SAFETY: the arguments match `dropout_step`; `at` is this device's live step value (one
    // u64), written on the compute stream in order.
    launched("dropout_step", unsafe { builder.launch(ONE_THREAD) })
}

/// The address of `device`'s step value for a dropout about to be queued: inside a capture
/// only once the value has been written, else an error (the replays would all draw the
/// capture's masks).
pub(crate) fn live_step(device: &CudaDevice) -> Result<u64> {
    let step = step_address(device, false)?;
    let written = steps()
        .as_ref()
        .and_then(|s| s.get(&device.id()))
        .is_some_and(|s| s.written);
    if !written && capturing(device)? {
        bail!(
            "dropout in a CUDA graph needs ops::set_dropout_step before each replay (else every \
             replay draws the same masks)"
        );
    }
    Ok(step)
}

/// Whether `dtype` has a dropout kernel.
pub(crate) fn has_kernel(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
}

/// `dropout` of a contiguous tensor on the device, differentiable: its gradient is the same
/// dropout of the gradient.
pub(crate) fn apply(x: &Tensor, dropout: &Dropout) -> Result<Tensor> {
    x.contiguous()?.apply_op1(DeviceDropout(*dropout))
}

struct DeviceDropout(Dropout);

impl CustomOp1 for DeviceDropout {
    fn name(&self) -> &'static str {
        "dropout"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> Result<(candle_core::CpuStorage, Shape)> {
        bail!("the device dropout runs on a GPU (the CPU draws its masks on the host)")
    }

    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        let out = match storage.dtype() {
            DType::F32 => launch::<f32>(storage, layout, &self.0),
            DType::BF16 => launch::<bf16>(storage, layout, &self.0),
            DType::F16 => launch::<f16>(storage, layout, &self.0),
            other => bail!("dropout: dtype {other:?} has no CUDA kernel"),
        }?;
        Ok((out, layout.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(apply(grad, &self.0)?))
    }
}

fn launch<T: CudaDType + DeviceRepr + WithDType>(
    storage: &CudaStorage,
    layout: &Layout,
    dropout: &Dropout,
) -> Result<CudaStorage> {
    let dims = layout.dims();
    let place =
        super::dropout::place(dims, dropout).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    let device = device_of(storage);
    let x = view::<T>(storage, layout, "dropout")?;
    let n = layout.shape().elem_count();
    let y = output::<T>(&device, n)?;
    let step = live_step(&device)?;
    let func = function(&device, &DROPOUT, "dropout_apply", T::DTYPE)?;
    let scale = (1.0 / (1.0 - dropout.p)) as f32;
    let (n, inner, len, total, offset) = (
        n as i64,
        place.inner as i64,
        place.len as i64,
        place.total as i64,
        place.offset as i64,
    );
    let mut builder = func.builder();
    builder.arg(&x).arg(&y).arg(&step).arg(&dropout.seed);
    builder.arg(&dropout.p).arg(&scale).arg(&n).arg(&inner);
    builder.arg(&len).arg(&total).arg(&offset);
    // SAFETY: the arguments match `dropout_apply`'s signature in kernels/dropout.cu; `x` and
    // `y` hold `n` elements, `step` is this device's live step value.
    launched("dropout_apply", unsafe {
        builder.launch(grid_stride(n as usize))
    })?;
    Ok(CudaStorage::wrap_cuda_slice(y, device))
}
