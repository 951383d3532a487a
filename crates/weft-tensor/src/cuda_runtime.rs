//! How a CUDA device's runtime is set up for training, and its memory high-water marks.
//!
//! Candle allocates every tensor with `cuMemAllocAsync` from the device's default memory pool.
//! Two defaults of that path cost a training step dearly, and [`configure`] changes them:
//! - the pool's release threshold is 0, so the driver hands freed memory back to the system at
//!   every synchronisation and the next step maps it again; weft keeps it (as PyTorch's caching
//!   allocator does);
//! - cudarc creates two CUDA events for every allocation (and records one per use once a second
//!   stream exists) to order streams automatically. weft orders its streams itself: the NCCL
//!   backend makes its stream wait on an event of the compute stream and keeps every tensor it
//!   reads or writes alive until the operation has completed. So the tracking is turned off.
//!
//! [`memory_usage`] reads the pool's current and peak bytes, plus those of CUDA graphs' own
//! allocations (a replayed training step allocates there): the equivalents of PyTorch's
//! `memory_allocated`, `max_memory_allocated`, `memory_reserved` and `max_memory_reserved`
//! (peaks as the sum of both peaks, an upper bound of the combined one).
//! [`device_memory_in_use`] is the device's own count, as nvidia-smi shows it.
//! [`set_profiler_collection`] brackets the part of a run an attached profiler records.

use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::Device;
use cudarc::driver::{result, sys};

use crate::error::{Result, TensorError};

/// Runtime settings of a CUDA device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaRuntimeSettings {
    /// Keep freed memory in the pool instead of releasing it at each synchronisation.
    pub keep_freed_memory: bool,
    /// cudarc's automatic per-allocation event tracking.
    pub event_tracking: bool,
}

impl Default for CudaRuntimeSettings {
    fn default() -> Self {
        Self {
            keep_freed_memory: true,
            event_tracking: false,
        }
    }
}

/// Bytes of the device's default memory pool and of CUDA graphs' memory nodes together: in use
/// by tensors (`used`) and taken from the device (`reserved`), now and at their highest since
/// the last [`reset_peak_memory`]. A peak is the pool's highest plus the graphs' highest, each
/// reached at its own time: an upper bound of what was held at once once a step is captured
/// (Phi-3-mini's replayed step: 76.3 GiB against the device's 73.7 GiB in use).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    pub used: u64,
    pub used_peak: u64,
    pub reserved: u64,
    pub reserved_peak: u64,
    /// Of `reserved`: what CUDA graphs' memory nodes hold (a captured step's tensors).
    pub graph_reserved: u64,
}

/// The largest cuDNN workspace allocated since [`take_workspace_peak`] last read it.
static WORKSPACE_PEAK: AtomicU64 = AtomicU64::new(0);

/// Notes a cuDNN workspace of `bytes` (its launches and algorithm searches call this).
#[cfg(feature = "cudnn")]
pub(crate) fn note_workspace(bytes: usize) {
    WORKSPACE_PEAK.fetch_max(bytes as u64, Ordering::Relaxed);
}

/// The largest cuDNN workspace this process allocated since the last call (the memory
/// tracker's `workspaces` category): one launch's scratch, taken from the memory pool.
pub fn take_workspace_peak() -> u64 {
    WORKSPACE_PEAK.swap(0, Ordering::Relaxed)
}

fn cuda_error(what: &str, e: impl std::fmt::Debug) -> TensorError {
    TensorError::Cuda(format!("{what}: {e:?}"))
}

/// The default memory pool of `device`'s GPU, with its context bound to this thread.
fn default_pool(device: &Device) -> Result<sys::CUmemoryPool> {
    let stream = device.as_cuda_device()?.cuda_stream();
    let context = stream.context();
    context
        .bind_to_thread()
        .map_err(|e| cuda_error("binding the CUDA context", e))?;
    // SAFETY: the device handle comes from a live context.
    unsafe { result::device::get_default_mem_pool(context.cu_device()) }
        .map_err(|e| cuda_error("reading the default memory pool", e))
}

fn pool_attribute(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute) -> Result<u64> {
    let mut value: u64 = 0;
    // SAFETY: every attribute read here is a cuuint64_t.
    unsafe { result::mem_pool::get_attribute(pool, attr, (&raw mut value).cast()) }
        .map_err(|e| cuda_error("reading a memory pool attribute", e))?;
    Ok(value)
}

fn set_pool_attribute(
    pool: sys::CUmemoryPool,
    attr: sys::CUmemPool_attribute,
    mut value: u64,
) -> Result<()> {
    // SAFETY: every attribute written here is a cuuint64_t.
    unsafe { result::mem_pool::set_attribute(pool, attr, (&raw mut value).cast()) }
        .map_err(|e| cuda_error("setting a memory pool attribute", e))
}

/// Applies `settings` to a freshly opened CUDA device; call it before the first tensor is
/// created on it (event tracking applies to allocations made after the call). Does nothing
/// for other devices.
pub fn configure(device: &Device, settings: CudaRuntimeSettings) -> Result<()> {
    if !device.is_cuda() {
        return Ok(());
    }
    let cuda = device.as_cuda_device()?;
    // SAFETY: with tracking off, cross-stream order is the caller's: weft's only other
    // stream (NCCL's) waits on an event of the compute stream before each operation and
    // keeps its tensors alive until the operation completes (see the module docs).
    unsafe {
        if settings.event_tracking {
            cuda.cuda_stream().context().enable_event_tracking();
        } else {
            cuda.disable_event_tracking();
        }
    }
    let threshold = if settings.keep_freed_memory {
        u64::MAX
    } else {
        0
    };
    set_pool_attribute(
        default_pool(device)?,
        sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
        threshold,
    )
}

/// The memory pool's usage on a CUDA device; `None` for other devices.
pub fn memory_usage(device: &Device) -> Result<Option<MemoryUsage>> {
    if !device.is_cuda() {
        return Ok(None);
    }
    use sys::CUmemPool_attribute as A;
    let pool = default_pool(device)?;
    use sys::CUgraphMem_attribute as G;
    let graph = |attr| graph_attribute(device, attr);
    Ok(Some(MemoryUsage {
        used: pool_attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?
            + graph(G::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)?,
        used_peak: pool_attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?
            + graph(G::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)?,
        reserved: pool_attribute(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?
            + graph(G::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)?,
        reserved_peak: pool_attribute(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?
            + graph(G::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)?,
        graph_reserved: graph(G::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)?,
    }))
}

/// Makes `device`'s CUDA context current on this thread.
fn bind_context(device: &Device) -> Result<()> {
    device
        .as_cuda_device()?
        .cuda_stream()
        .context()
        .bind_to_thread()
        .map_err(|e| cuda_error("binding the CUDA context", e))
}

/// Bytes in use on the whole device as the driver sees it (total minus free): every process's
/// allocations, the CUDA context and libraries, the memory pool's reserve and CUDA graphs'
/// memory; `None` for other devices.
pub fn device_memory_in_use(device: &Device) -> Result<Option<u64>> {
    if !device.is_cuda() {
        return Ok(None);
    }
    bind_context(device)?;
    let (free, total) = result::mem_get_info().map_err(|e| cuda_error("reading free memory", e))?;
    Ok(Some((total - free) as u64))
}

/// Takes all of the device's free memory but what leaves `cap` bytes in use in total (this
/// process's context and tensors included), and returns the allocation, which holds it until
/// dropped: the rest of the process then sees a device of `cap` bytes, to try a run against a
/// smaller GPU. `None` for other devices.
pub fn cap_device_memory(device: &Device, cap: u64) -> Result<Option<candle_core::Tensor>> {
    let Some(in_use) = device_memory_in_use(device)? else {
        return Ok(None);
    };
    let (free, _) = result::mem_get_info().map_err(|e| cuda_error("reading free memory", e))?;
    if cap <= in_use {
        return Err(TensorError::Cuda(format!(
            "a memory cap of {cap} bytes is below the {in_use} bytes in use already"
        )));
    }
    let blocked = (free as u64).saturating_sub(cap - in_use);
    let len = usize::try_from(blocked).map_err(|e| cuda_error("sizing the blocker", e))?;
    Ok(Some(candle_core::Tensor::zeros(
        len,
        candle_core::DType::U8,
        device,
    )?))
}

/// A memory attribute of the device's CUDA graphs (their allocations live apart from the
/// default pool).
fn graph_attribute(device: &Device, attr: sys::CUgraphMem_attribute) -> Result<u64> {
    let cu_device = device.as_cuda_device()?.cuda_stream().context().cu_device();
    let mut value: u64 = 0;
    // SAFETY: every graph memory attribute is a cuuint64_t.
    unsafe { sys::cuDeviceGetGraphMemAttribute(cu_device, attr, (&raw mut value).cast()) }
        .result()
        .map_err(|e| cuda_error("reading a graph memory attribute", e))?;
    Ok(value)
}

/// Returns the memory the pool keeps of freed allocations to the device, down to what is in
/// use: after a CUDA graph has been captured, the eager warm-up steps' memory is not needed.
pub fn release_cached_memory(device: &Device) -> Result<()> {
    if !device.is_cuda() {
        return Ok(());
    }
    let pool = default_pool(device)?;
    // SAFETY: a live pool of this device.
    unsafe { sys::cuMemPoolTrimTo(pool, 0) }
        .result()
        .map_err(|e| cuda_error("trimming the memory pool", e))
}

/// Returns to the device the physical memory CUDA graphs keep mapped between launches, once
/// the device has finished every queued launch (it waits for them): the graphs' temporaries,
/// idle until the next launch, which maps them again. Eager work between launches (a
/// validation pass) then runs in that memory instead of beside it.
pub fn release_graph_memory(device: &Device) -> Result<()> {
    if !device.is_cuda() {
        return Ok(());
    }
    device.synchronize()?;
    let cu_device = device.as_cuda_device()?.cuda_stream().context().cu_device();
    // SAFETY: a valid device; blocks of a graph still executing or queued are kept.
    unsafe { sys::cuDeviceGraphMemTrim(cu_device) }
        .result()
        .map_err(|e| cuda_error("trimming the graphs' memory", e))
}

/// Restarts the peak counters of [`memory_usage`] from the current values.
pub fn reset_peak_memory(device: &Device) -> Result<()> {
    if !device.is_cuda() {
        return Ok(());
    }
    use sys::CUmemPool_attribute as A;
    let pool = default_pool(device)?;
    set_pool_attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0)?;
    set_pool_attribute(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0)?;
    let cu_device = device.as_cuda_device()?.cuda_stream().context().cu_device();
    for attr in [
        sys::CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
        sys::CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
    ] {
        let mut zero: u64 = 0;
        // SAFETY: the high-water attributes are cuuint64_t and may only be reset to zero.
        unsafe { sys::cuDeviceSetGraphMemAttribute(cu_device, attr, (&raw mut zero).cast()) }
            .result()
            .map_err(|e| cuda_error("resetting a graph memory attribute", e))?;
    }
    Ok(())
}

/// Starts (`true`) or stops (`false`) the collection of a profiler attached with its
/// collection off at start (`ncu --profile-from-start off`, `nsys --capture-range=cudaProfilerApi`),
/// so a profile holds the steady-state steps and none of the set-up.
pub fn set_profiler_collection(device: &Device, on: bool) -> Result<()> {
    if !device.is_cuda() {
        return Ok(());
    }
    bind_context(device)?;
    // SAFETY: the context is bound to this thread; both calls take no arguments.
    unsafe {
        if on {
            sys::cuProfilerStart()
        } else {
            sys::cuProfilerStop()
        }
    }
    .result()
    .map_err(|e| cuda_error("switching the profiler's collection", e))
}
