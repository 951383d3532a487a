//! What `sdpa_cudnn` runs its plans with: the per-thread cache of planned passes (each pass,
//! type, geometry and variant planned once on first use: cuDNN's first heuristic choice that
//! finalizes; a configuration cuDNN has no engine for is remembered, said once in the log, and
//! the caller takes its own path), the device addresses of the tensors, scratch memory, and one
//! execution of a plan.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;

use candle_core::cuda::{CudaDType, CudaDevice, CudaStorage};
use candle_core::op::BackpropOp;
use candle_core::{DType, Result, Shape, Storage, Tensor};
use cudarc::cudnn::result::CudnnResult;
use cudarc::cudnn::sys;
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};

use super::conv_cudnn::handle;
use super::cudnn_backend::{execute, Descriptor};
use super::sdpa_graph::SdpaGeometry;

/// A planned pass's key: forward or backward, its data type, geometry, (backward)
/// deterministic variant, and the bits of its dropout probability (`None`: no dropout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub forward: bool,
    pub dtype: DType,
    pub geometry: SdpaGeometry,
    pub deterministic: bool,
    pub dropout: Option<u64>,
}

/// A planned pass.
pub(crate) struct Plan {
    pub plan: Descriptor,
    pub workspace: usize,
}

thread_local! {
    static PLANS: RefCell<HashMap<Key, std::result::Result<Rc<Plan>, String>>> =
        RefCell::new(HashMap::new());
}

/// The plan of `key`, built on first use; `None` where cuDNN has none (remembered with why,
/// [`fused_attention_plans`], and logged once).
pub(crate) fn plan_for(
    key: Key,
    build: impl FnOnce() -> CudnnResult<(Descriptor, usize)>,
) -> Option<Rc<Plan>> {
    if let Some(known) = PLANS.with(|p| p.borrow().get(&key).cloned()) {
        return known.ok();
    }
    let built = match build() {
        Ok((plan, workspace)) => Ok(Rc::new(Plan { plan, workspace })),
        Err(e) => {
            let pass = if key.forward { "forward" } else { "backward" };
            let why = format!("no cuDNN fused attention {pass} for {key:?}: {e:?}");
            tracing::warn!("{why}; weft's own attention runs instead");
            Err(why)
        }
    };
    PLANS.with(|p| p.borrow_mut().insert(key, built.clone()));
    built.ok()
}

/// One line per pass, type and geometry planned on this thread: its workspace, or why cuDNN
/// had no engine for it (and weft's own path ran instead).
pub fn fused_attention_plans() -> Vec<String> {
    PLANS.with(|plans| {
        plans
            .borrow()
            .iter()
            .map(|(key, plan)| match plan {
                Ok(plan) => format!("{key:?}: cuDNN, workspace {} B", plan.workspace),
                Err(why) => why.clone(),
            })
            .collect()
    })
}

/// Whether cuDNN needs its `dQ` accumulator zeroed by the caller (before 9.6).
pub(crate) fn zero_accumulator() -> bool {
    // SAFETY: a plain query of the loaded library's version.
    unsafe { sys::cudnnGetVersion() < 90600 }
}

/// Whether every address is on the 16 bytes the graphs' tensors declare.
pub(crate) fn aligned(addresses: &[u64]) -> bool {
    addresses.iter().all(|a| a % 16 == 0)
}

pub(crate) fn io_type(dtype: DType) -> Option<sys::cudnnDataType_t> {
    match dtype {
        DType::BF16 => Some(sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16),
        DType::F16 => Some(sys::cudnnDataType_t::CUDNN_DATA_HALF),
        _ => None,
    }
}

/// A contiguous CUDA tensor's device and the address of its first element (`T` its type).
pub(crate) fn address<T: CudaDType>(t: &Tensor) -> Result<Option<(CudaDevice, u64)>> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        return Ok(None);
    };
    if !layout.is_contiguous() {
        return Ok(None);
    }
    let device = cuda.device.clone();
    let stream = device.cuda_stream();
    let slice = cuda.as_cuda_slice::<T>()?.slice(layout.start_offset()..);
    let (at, _) = slice.device_ptr(&stream);
    Ok(Some((device, at)))
}

/// Device memory as a tensor of `shape`.
pub(crate) fn wrap(
    storage: CudaSlice<impl CudaDType + DeviceRepr>,
    device: &CudaDevice,
    shape: Shape,
) -> Tensor {
    let storage = CudaStorage::wrap_cuda_slice(storage, device.clone());
    Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
}

/// Scratch memory: cuDNN's workspace followed by the caller's f32 regions, each 256-byte
/// aligned; returns the buffer and each region's address.
pub(crate) fn scratch(
    device: &CudaDevice,
    workspace: usize,
    f32_regions: &[usize],
) -> Result<(CudaSlice<u8>, Vec<u64>)> {
    let align = |n: usize| n.div_ceil(256) * 256;
    let mut sizes = vec![align(workspace.max(1))];
    sizes.extend(f32_regions.iter().map(|n| align(4 * n)));
    let total: usize = sizes.iter().sum();
    crate::cuda_runtime::note_workspace(total);
    // SAFETY: scratch memory for cuDNN, every byte written before it is read (or zeroed).
    let buffer: CudaSlice<u8> = unsafe { device.alloc::<u8>(total)? };
    let (base, _) = buffer.device_ptr(&device.cuda_stream());
    let mut at = base;
    let mut starts = Vec::with_capacity(sizes.len());
    for size in sizes {
        starts.push(at);
        at += size as u64;
    }
    Ok((buffer, starts))
}

/// Runs `plan` on `device`'s stream with the variant pack `uids` → `pointers`.
pub(crate) fn run(
    plan: &Plan,
    device: &CudaDevice,
    uids: &[i64],
    pointers: &[*mut c_void],
    workspace: u64,
) -> Result<()> {
    let stream = device.cuda_stream();
    let cudnn = handle(&stream)?;
    // SAFETY: every pointer addresses a live buffer of the layout its uid's descriptor gives
    // (checked by the callers: contiguous tensors of the geometry's sizes, scalars on the
    // caller's stack), and the workspace is at least the plan's size.
    unsafe {
        execute(
            cudnn.0,
            &plan.plan,
            uids,
            pointers,
            workspace as *mut c_void,
        )
    }
    .map_err(|e| candle_core::Error::Msg(format!("cuDNN fused attention: {e:?}")))
}
