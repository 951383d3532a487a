//! Launches the kernels of `kernels/multi_tensor.cu`: the tensors' device addresses travel by
//! value in a [`TensorList`] of at most [`MAX_TENSORS`] entries, one launch per list.
//!
//! The kernels write through addresses read from storages that are only borrowed for reading
//! (a parameter is a Candle `Var`, whose storage Candle hands out mutably to itself alone).
//! This is sound for device memory: the host never touches it, and every kernel runs on the
//! device's compute stream, ordered after all work already queued on those tensors. A tensor
//! dropped right after the call is freed stream-ordered (`cuMemFreeAsync`) after the kernel.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::{CudaDevice, CudaStorageSlice};
use candle_core::{bail, DType, Result, Storage, Tensor};
use cudarc::driver::{DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};

use super::cuda_launch::{function_named, launched, MULTI_TENSOR, THREADS};
use super::multi_tensor::SgdStep;

/// Entries of one [`TensorList`] (as `MAX_TENSORS` in the kernel source).
const MAX_TENSORS: usize = 48;

/// The kernels' by-value argument: per tensor two addresses (or an address and an offset) and
/// a length.
#[repr(C)]
#[derive(Clone, Copy)]
struct TensorList {
    a: [u64; MAX_TENSORS],
    b: [u64; MAX_TENSORS],
    len: [u64; MAX_TENSORS],
    count: u32,
}

// SAFETY: plain old data laid out as `struct TensorList` in kernels/multi_tensor.cu.
unsafe impl DeviceRepr for TensorList {}

impl TensorList {
    fn new(entries: &[(u64, u64, u64)]) -> Self {
        let mut list = Self {
            a: [0; MAX_TENSORS],
            b: [0; MAX_TENSORS],
            len: [0; MAX_TENSORS],
            count: entries.len() as u32,
        };
        for (i, &(a, b, len)) in entries.iter().enumerate() {
            (list.a[i], list.b[i], list.len[i]) = (a, b, len);
        }
        list
    }
}

/// The device address of a contiguous CUDA tensor's first element.
fn address(tensor: &Tensor) -> Result<u64> {
    let (storage, layout) = tensor.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        bail!("multi-tensor kernels: a tensor is not on a CUDA device");
    };
    if !layout.is_contiguous() {
        bail!("multi-tensor kernels: tensors must be contiguous");
    }
    let stream = cuda.device().cuda_stream();
    let base = match &cuda.slice {
        CudaStorageSlice::U8(s) => s.device_ptr(&stream).0,
        CudaStorageSlice::U32(s) => s.device_ptr(&stream).0,
        CudaStorageSlice::I16(s) => s.device_ptr(&stream).0,
        CudaStorageSlice::I32(s) => s.device_ptr(&stream).0,
        CudaStorageSlice::I64(s) => s.device_ptr(&stream).0,
        CudaStorageSlice::BF16(s) => s.device_ptr(&stream).0,
        CudaStorageSlice::F16(s) => s.device_ptr(&stream).0,
        CudaStorageSlice::F32(s) => s.device_ptr(&stream).0,
        CudaStorageSlice::F64(s) => s.device_ptr(&stream).0,
        _ => bail!(
            "multi-tensor kernels: dtype {:?} is not supported",
            cuda.dtype()
        ),
    };
    Ok(base + (layout.start_offset() * tensor.dtype().size_in_bytes()) as u64)
}

fn device(tensor: &Tensor) -> Result<CudaDevice> {
    Ok(tensor.device().as_cuda_device()?.clone())
}

/// Blocks per tensor: enough for the longest tensor of the list at 4 elements per thread,
/// at most 1024 (the blocks stride over longer tensors).
fn config(entries: &[(u64, u64, u64)], per_block: u64, count: usize) -> LaunchConfig {
    let longest = entries.iter().map(|e| e.2).max().unwrap_or(0);
    LaunchConfig {
        grid_dim: (
            longest.div_ceil(per_block).clamp(1, 1024) as u32,
            count as u32,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `dst ← src` for each pair (contiguous, same byte length: checked by the caller).
pub(crate) fn copy(pairs: &[(&Tensor, &Tensor)]) -> Result<()> {
    let Some((first, _)) = pairs.first() else {
        return Ok(());
    };
    let device = device(first)?;
    let func = function_named(&device, &MULTI_TENSOR, "multi_copy")?;
    let entries = pairs
        .iter()
        .map(|(src, dst)| {
            let bytes = (dst.elem_count() * dst.dtype().size_in_bytes()) as u64;
            Ok((address(dst)?, address(src)?, bytes))
        })
        .collect::<Result<Vec<_>>>()?;
    for chunk in entries.chunks(MAX_TENSORS) {
        let list = TensorList::new(chunk);
        let mut builder = func.builder();
        builder.arg(&list);
        // SAFETY: every entry names `len` valid bytes at both addresses (contiguous tensors of
        // the same byte length, alive until the kernel has run: see the module docs).
        launched("multi_copy", unsafe {
            builder.launch(config(chunk, 16 * THREADS as u64, chunk.len()))
        })?;
    }
    Ok(())
}

fn sgd_typed<T: DeviceRepr + candle_core::WithDType>(
    params: &[&Tensor],
    offsets: &[usize],
    grads: &Tensor,
    momentum_buffer: &Tensor,
    lr: &Tensor,
    step: &SgdStep,
) -> Result<()> {
    let device = device(grads)?;
    let func = function_named(
        &device,
        &MULTI_TENSOR,
        &format!("multi_sgd_{}", suffix(T::DTYPE)?),
    )?;
    let entries = params
        .iter()
        .zip(offsets)
        .map(|(p, &offset)| Ok((address(p)?, offset as u64, p.elem_count() as u64)))
        .collect::<Result<Vec<_>>>()?;
    let (grads_at, buffer_at, lr_at) = (
        address(grads)?,
        address(momentum_buffer)?,
        address(&lr.contiguous()?)?,
    );
    let scalar = |v: f64| T::from_f64(v);
    let (lr_scale, wd, momentum, dampening) = (
        scalar(step.lr_scale),
        scalar(step.weight_decay),
        scalar(step.momentum),
        scalar(step.dampening),
    );
    let flags = [step.nesterov, step.maximize, step.first_step].map(i32::from);
    for chunk in entries.chunks(MAX_TENSORS) {
        let list = TensorList::new(chunk);
        let mut builder = func.builder();
        builder
            .arg(&list)
            .arg(&grads_at)
            .arg(&buffer_at)
            .arg(&lr_at)
            .arg(&lr_scale)
            .arg(&wd)
            .arg(&momentum)
            .arg(&dampening)
            .arg(&flags[0])
            .arg(&flags[1])
            .arg(&flags[2]);
        // SAFETY: the arguments match `multi_sgd_*` in kernels/multi_tensor.cu; each parameter
        // holds `len` elements of T and lies, at its offset, inside both flat buffers (checked
        // by the caller).
        launched("multi_sgd", unsafe {
            builder.launch(config(chunk, 4 * THREADS as u64, chunk.len()))
        })?;
    }
    Ok(())
}

fn suffix(dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::F64 => Ok("f64"),
        other => bail!("multi_sgd: dtype {other:?} is not supported (f32, f64)"),
    }
}

/// One SGD step of `params` in place (arguments checked by the caller).
pub(crate) fn sgd(
    params: &[&Tensor],
    offsets: &[usize],
    grads: &Tensor,
    momentum_buffer: &Tensor,
    lr: &Tensor,
    step: &SgdStep,
) -> Result<()> {
    match grads.dtype() {
        DType::F32 => sgd_typed::<f32>(params, offsets, grads, momentum_buffer, lr, step),
        DType::F64 => sgd_typed::<f64>(params, offsets, grads, momentum_buffer, lr, step),
        other => bail!("multi_sgd: dtype {other:?} is not supported (f32, f64)"),
    }
}
