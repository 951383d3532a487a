//! Launches the passes of `kernels/batch_norm_sync.cu`, one thread a value.

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::batch_norm_cuda::one_thread_each;
use super::batch_norm_sync_op::SyncPass;
use super::cuda_launch::{device_of, function, launched, output, view, BATCH_NORM_SYNC};

/// `pass` over `a` (and `b`) with `c` channels, in the statistics' type of `a`.
pub(super) fn run(
    pass: SyncPass,
    a: (&CudaStorage, &Layout),
    b: Option<(&CudaStorage, &Layout)>,
    c: usize,
) -> Result<CudaStorage> {
    match a.0.dtype() {
        DType::F32 => launch::<f32>(pass, a, b, c),
        DType::F64 => launch::<f64>(pass, a, b, c),
        other => bail!("weft-batch-norm-sync: statistics of dtype {other:?} (f32 or f64 only)"),
    }
}

fn launch<S: CudaDType + DeviceRepr + WithDType>(
    pass: SyncPass,
    a: (&CudaStorage, &Layout),
    b: Option<(&CudaStorage, &Layout)>,
    c: usize,
) -> Result<CudaStorage> {
    let device = device_of(a.0);
    let (name, len) = match pass {
        SyncPass::Pack { .. } => ("bn_sync_pack", 2 * c + 1),
        SyncPass::Combine => ("bn_sync_combine", 4 * c + 1),
        SyncPass::Scale { .. } => ("bn_sync_scale", 6 * c),
    };
    let av = view::<S>(a.0, a.1, name)?;
    let out = output::<S>(&device, len)?;
    let func = function(&device, &BATCH_NORM_SYNC, name, S::DTYPE)?;
    let channels = c as i32;
    let (first_row, count) = match pass {
        SyncPass::Pack { first_row, count } => (first_row as i32, S::from_f64(count)),
        SyncPass::Scale { count } => (0, S::from_f64(count)),
        SyncPass::Combine => (0, S::zero()),
    };
    let ranks = a.1.dims()[0] as i32;
    let bv = match b {
        Some((s, l)) => Some(view::<S>(s, l, name)?),
        None => None,
    };
    let mut builder = func.builder();
    builder.arg(&av);
    if let Some(bv) = &bv {
        builder.arg(bv);
    }
    builder.arg(&out).arg(&channels);
    match pass {
        SyncPass::Pack { .. } => builder.arg(&first_row).arg(&count),
        SyncPass::Combine => builder.arg(&ranks),
        SyncPass::Scale { .. } => builder.arg(&count),
    };
    // SAFETY: the arguments match `kernels/batch_norm_sync.cu` in order and type (the op
    // checked the shapes: a table of at least two rows from `first_row`, `ranks x (2C + 1)`
    // and `4 x C`, `6 x C` and `2C + 1`); the threads write all `len` values of the output
    // (for Combine: the 4C table values of its C threads and the factor of thread 0).
    let threads = match pass {
        SyncPass::Combine => c,
        _ => len,
    };
    launched(name, unsafe { builder.launch(one_thread_each(threads)) })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}
