//! Runs cuDNN's fused causal attention (`sdpa_graph`) on packed projections: queries, keys and
//! values read in place from the rows of one `[batch · seq, (heads + 2 kv_heads) · head_dim]`
//! tensor (a fused q | k | v projection, as llm.c passes them), the output written as
//! `[batch · seq, heads · head_dim]` rows and the gradients of q, k and v into one tensor of
//! the projection's layout: no head split, transpose or concatenation around the kernels.
//!
//! Each pass, type, geometry and variant is planned once per thread on first use (cuDNN's first
//! heuristic choice that finalizes; the engines compile at run time, about a second each, so a
//! warm-up step pays for them); a geometry cuDNN has no engine for is remembered and the caller
//! takes its own path. The backward is cuDNN's deterministic variant under
//! [`super::determinism::deterministic`], its faster accumulating one otherwise.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;

use candle_core::cuda::{CudaDType, CudaDevice, CudaStorage};
use candle_core::op::BackpropOp;
use candle_core::{DType, Result, Shape, Storage, Tensor};
use cudarc::cudnn::sys;
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};

use super::conv_cudnn::handle;
use super::cudnn_backend::{execute, Descriptor};
use super::packed_attention::PackedHeads;
use super::sdpa_graph::{backward_plan, forward_plan, uid, SdpaGeometry};

/// The cuDNN geometry of `batch` sequences of `seq` tokens of packed `heads`.
fn geometry(heads: PackedHeads, batch: usize, seq: usize) -> SdpaGeometry {
    let (row, out, d) = (
        heads.row_width() as i64,
        heads.out_width() as i64,
        heads.head_dim as i64,
    );
    let t = seq as i64;
    SdpaGeometry {
        batch: batch as i64,
        heads: heads.heads as i64,
        kv_heads: heads.kv_heads as i64,
        seq: t,
        head_dim: d,
        qkv_strides: [[t * row, d, row, 1]; 3],
        out_strides: [t * out, d, out, 1],
    }
}

/// Forward or backward, its data type, geometry and (backward) deterministic variant.
type Key = (bool, DType, SdpaGeometry, bool);

/// A planned pass.
struct Plan {
    plan: Descriptor,
    workspace: usize,
}

thread_local! {
    static PLANS: RefCell<HashMap<Key, std::result::Result<Rc<Plan>, String>>> =
        RefCell::new(HashMap::new());
}

/// The plan of `key`, built on first use; `None` where cuDNN has none (remembered, with why:
/// [`fused_attention_plans`]).
fn plan_for(
    key: Key,
    build: impl FnOnce() -> cudarc::cudnn::result::CudnnResult<(Descriptor, usize)>,
) -> Option<Rc<Plan>> {
    if let Some(known) = PLANS.with(|p| p.borrow().get(&key).cloned()) {
        return known.ok();
    }
    let built = match build() {
        Ok((plan, workspace)) => Ok(Rc::new(Plan { plan, workspace })),
        Err(e) => {
            let pass = if key.0 { "forward" } else { "backward" };
            Err(format!(
                "no cuDNN fused attention {pass} for {key:?}: {e:?}"
            ))
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
fn zero_accumulator() -> bool {
    // SAFETY: a plain query of the loaded library's version.
    unsafe { sys::cudnnGetVersion() < 90600 }
}

/// Whether every address is on the 16 bytes the graphs' tensors declare.
fn aligned(addresses: &[u64]) -> bool {
    addresses.iter().all(|a| a % 16 == 0)
}

fn io_type(dtype: DType) -> Option<sys::cudnnDataType_t> {
    match dtype {
        DType::BF16 => Some(sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16),
        DType::F16 => Some(sys::cudnnDataType_t::CUDNN_DATA_HALF),
        _ => None,
    }
}

/// A contiguous 16-bit CUDA tensor's storage, device and the address of its first element.
fn address<T: CudaDType>(t: &Tensor) -> Result<Option<(CudaDevice, u64)>> {
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

fn wrap(
    storage: CudaSlice<impl CudaDType + DeviceRepr>,
    device: &CudaDevice,
    shape: Shape,
) -> Tensor {
    let storage = CudaStorage::wrap_cuda_slice(storage, device.clone());
    Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
}

/// Scratch memory: cuDNN's workspace followed by the caller's f32 regions, each 256-byte
/// aligned; returns the buffer and each region's address.
fn scratch(
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

fn run(
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

/// The fused forward of `qkv` (`[batch, seq, row_width]`, bf16/f16, contiguous, on a GPU):
/// the output (`[batch, seq, heads · head_dim]`) and each query row's log-sum-exp of its
/// scaled, masked scores (`[batch, heads, seq]`, f32); `None` where cuDNN does not apply.
pub(crate) fn forward(qkv: &Tensor, heads: PackedHeads) -> Result<Option<(Tensor, Tensor)>> {
    match qkv.dtype() {
        DType::BF16 => forward_typed::<half::bf16>(qkv, heads),
        DType::F16 => forward_typed::<half::f16>(qkv, heads),
        _ => Ok(None),
    }
}

fn forward_typed<T: CudaDType + DeviceRepr>(
    qkv: &Tensor,
    heads: PackedHeads,
) -> Result<Option<(Tensor, Tensor)>> {
    let (batch, seq, _) = qkv.dims3()?;
    let Some((device, base)) = address::<T>(qkv)? else {
        return Ok(None);
    };
    let geometry = geometry(heads, batch, seq);
    let io = io_type(qkv.dtype()).expect("a 16-bit type");
    let key = (true, qkv.dtype(), geometry, false);
    let cudnn = handle(&device.cuda_stream())?;
    let Some(plan) = plan_for(key, || forward_plan(cudnn.0, io, &geometry)) else {
        return Ok(None);
    };
    let rows = batch * seq;
    // SAFETY: cuDNN writes every element of the output and of the statistics.
    let out: CudaSlice<T> = unsafe { device.alloc::<T>(rows * heads.out_width())? };
    let stats: CudaSlice<f32> = unsafe { device.alloc::<f32>(rows * heads.heads)? };
    let stream = device.cuda_stream();
    let (out_at, _) = out.device_ptr(&stream);
    let (stats_at, _) = stats.device_ptr(&stream);
    let (_scratch, starts) = scratch(&device, plan.workspace, &[])?;
    let element = std::mem::size_of::<T>() as u64;
    let [q, k, v] = heads.offsets().map(|o| base + o as u64 * element);
    if !aligned(&[q, k, v, out_at, stats_at]) {
        return Ok(None);
    }
    let (mut scale, mut neg_inf) = (1.0 / (heads.head_dim as f32).sqrt(), f32::NEG_INFINITY);
    let host = |x: &mut f32| x as *mut f32 as *mut c_void;
    let at = |p: u64| p as *mut c_void;
    let uids = [
        uid::Q,
        uid::K,
        uid::V,
        uid::O,
        uid::STATS,
        uid::SCALE,
        uid::NEG_INF,
    ];
    let pointers = [
        at(q),
        at(k),
        at(v),
        at(out_at),
        at(stats_at),
        host(&mut scale),
        host(&mut neg_inf),
    ];
    run(&plan, &device, &uids, &pointers, starts[0])?;
    let out = wrap(out, &device, Shape::from((batch, seq, heads.out_width())));
    let stats = wrap(stats, &device, Shape::from((batch, heads.heads, seq)));
    Ok(Some((out, stats)))
}

/// The gradient of the packed projection (`[batch, seq, row_width]`) from `qkv`, the forward's
/// `out` and `lse` and the output's gradient `d_out`; `None` where cuDNN does not apply.
pub(crate) fn backward(
    qkv: &Tensor,
    out: &Tensor,
    lse: &Tensor,
    d_out: &Tensor,
    heads: PackedHeads,
) -> Result<Option<Tensor>> {
    match qkv.dtype() {
        DType::BF16 => backward_typed::<half::bf16>(qkv, out, lse, d_out, heads),
        DType::F16 => backward_typed::<half::f16>(qkv, out, lse, d_out, heads),
        _ => Ok(None),
    }
}

fn backward_typed<T: CudaDType + DeviceRepr>(
    qkv: &Tensor,
    out: &Tensor,
    lse: &Tensor,
    d_out: &Tensor,
    heads: PackedHeads,
) -> Result<Option<Tensor>> {
    let (batch, seq, _) = qkv.dims3()?;
    if lse.dtype() != DType::F32 || out.dtype() != qkv.dtype() || d_out.dtype() != qkv.dtype() {
        return Ok(None);
    }
    let addresses = (
        address::<T>(qkv)?,
        address::<T>(out)?,
        address::<f32>(lse)?,
        address::<T>(d_out)?,
    );
    let (Some((device, base)), Some((_, out_at)), Some((_, lse_at)), Some((_, d_out_at))) =
        addresses
    else {
        return Ok(None);
    };
    let deterministic = super::determinism::deterministic();
    let geometry = geometry(heads, batch, seq);
    let io = io_type(qkv.dtype()).expect("a 16-bit type");
    let key = (false, qkv.dtype(), geometry, deterministic);
    let cudnn = handle(&device.cuda_stream())?;
    let Some(plan) = plan_for(key, || {
        // The frontend types the view of K read by the dQ product as an intermediate (f32);
        // should this cuDNN refuse it, the data's own type.
        let float = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
        backward_plan(cudnn.0, io, &geometry, deterministic, float)
            .or_else(|_| backward_plan(cudnn.0, io, &geometry, deterministic, io))
    }) else {
        return Ok(None);
    };
    let rows = batch * seq;
    // SAFETY: cuDNN writes every element of dQ, dK and dV, which tile the packed rows.
    let d_qkv: CudaSlice<T> = unsafe { device.alloc::<T>(rows * heads.row_width())? };
    let stream = device.cuda_stream();
    let (d_at, _) = d_qkv.device_ptr(&stream);
    let row_values = rows * heads.heads;
    let accumulator = match deterministic {
        true => 0,
        false => row_values * heads.head_dim,
    };
    let (mut scratch_buffer, starts) =
        scratch(&device, plan.workspace, &[row_values, accumulator])?;
    if !deterministic && zero_accumulator() {
        let start = (starts[2] - starts[0]) as usize;
        let mut region = scratch_buffer.slice_mut(start..start + 4 * accumulator);
        stream
            .memset_zeros(&mut region)
            .map_err(|e| candle_core::Error::Msg(format!("{e:?}")))?;
    }
    let element = std::mem::size_of::<T>() as u64;
    let [q, k, v] = heads.offsets().map(|o| base + o as u64 * element);
    let [dq, dk, dv] = heads.offsets().map(|o| d_at + o as u64 * element);
    if !aligned(&[q, k, v, out_at, d_out_at, lse_at, dq, dk, dv]) {
        return Ok(None);
    }
    let mut scalars = [1.0 / (heads.head_dim as f32).sqrt(), f32::NEG_INFINITY, 1.0];
    let [scale, neg_inf, one] = scalars.each_mut().map(|x| x as *mut f32 as *mut c_void);
    let at = |p: u64| p as *mut c_void;
    let mut uids = vec![
        uid::Q,
        uid::K,
        uid::V,
        uid::O,
        uid::D_O,
        uid::STATS,
        uid::D_Q,
        uid::D_K,
        uid::D_V,
        uid::SCALE,
        uid::NEG_INF,
        uid::ONE,
        uid::ROW_DOT,
    ];
    let mut pointers = vec![
        at(q),
        at(k),
        at(v),
        at(out_at),
        at(d_out_at),
        at(lse_at),
        at(dq),
        at(dk),
        at(dv),
        scale,
        neg_inf,
        one,
        at(starts[1]),
    ];
    if !deterministic {
        uids.push(uid::DQ_ACCUM);
        pointers.push(at(starts[2]));
    }
    run(&plan, &device, &uids, &pointers, starts[0])?;
    Ok(Some(wrap(
        d_qkv,
        &device,
        Shape::from((batch, seq, heads.row_width())),
    )))
}
