//! Launches the kernels of `kernels/multi_tensor.cu`: the tensors' device addresses travel by
//! value in a [`TensorList`] of at most [`MAX_TENSORS`] entries, one launch per list. The
//! kernels write through addresses of storages only borrowed for reading (see
//! [`device_address`] for why that is sound).

use candle_core::cuda_backend::CudaDevice;
use candle_core::{bail, DType, Result, Tensor};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::cuda_launch::{device_address, function_named, launched, MULTI_TENSOR, THREADS};

/// Entries of one [`TensorList`] (as `MAX_TENSORS` in the kernel source).
const MAX_TENSORS: usize = 48;

/// The kernel's by-value argument: per tensor two addresses, a length (bytes for a copy,
/// elements when widened) and whether it is widened.
#[repr(C)]
#[derive(Clone, Copy)]
struct TensorList {
    a: [u64; MAX_TENSORS],
    b: [u64; MAX_TENSORS],
    len: [u64; MAX_TENSORS],
    widened: [u8; MAX_TENSORS],
    count: u32,
}

// SAFETY: plain old data laid out as `struct TensorList` in kernels/multi_tensor.cu.
unsafe impl DeviceRepr for TensorList {}

/// One pair's entry: destination and source addresses, and what moves between them.
#[derive(Clone, Copy)]
struct Entry {
    dst: u64,
    src: u64,
    len: u64,
    widened: bool,
}

impl Entry {
    /// Blocks of [`THREADS`] that cover the entry at one 16-byte load a thread.
    fn blocks(&self) -> u64 {
        let per_block = match self.widened {
            true => 8 * THREADS as u64,
            false => 16 * THREADS as u64,
        };
        self.len.div_ceil(per_block)
    }
}

impl TensorList {
    fn new(entries: &[Entry]) -> Self {
        let mut list = Self {
            a: [0; MAX_TENSORS],
            b: [0; MAX_TENSORS],
            len: [0; MAX_TENSORS],
            widened: [0; MAX_TENSORS],
            count: entries.len() as u32,
        };
        for (i, e) in entries.iter().enumerate() {
            (list.a[i], list.b[i], list.len[i]) = (e.dst, e.src, e.len);
            list.widened[i] = u8::from(e.widened);
        }
        list
    }
}

/// Blocks per tensor: enough for the longest entry of the list, at most 1024 (the blocks
/// stride over longer tensors).
fn config(entries: &[Entry]) -> LaunchConfig {
    let blocks = entries.iter().map(Entry::blocks).max().unwrap_or(1);
    LaunchConfig {
        grid_dim: (blocks.clamp(1, 1024) as u32, entries.len() as u32, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The entry of `dst ← src`: a byte copy of the same dtype, or 16-bit elements widened into an
/// f32 `dst` (as many elements; checked by the caller).
fn entry(src: &Tensor, dst: &Tensor) -> Result<Entry> {
    let widened = src.dtype() != dst.dtype();
    if widened && dst.dtype() != DType::F32 {
        bail!("copy_tensors: widening into {:?}, not f32", dst.dtype());
    }
    let len = match widened {
        true => dst.elem_count(),
        false => dst.elem_count() * dst.dtype().size_in_bytes(),
    };
    Ok(Entry {
        dst: device_address(dst)?,
        src: device_address(src)?,
        len: len as u64,
        widened,
    })
}

/// `dst ← src` for each pair (contiguous, as many elements, same dtype or a 16-bit source and
/// an f32 destination: checked by the caller): one launch per [`MAX_TENSORS`] pairs,
/// `multi_copy` when nothing is widened, else `multi_copy_widen_{bf16,f16}` (the copies ride
/// with the first 16-bit dtype's widenings).
pub(crate) fn copy_and_widen(pairs: &[(&Tensor, &Tensor)]) -> Result<()> {
    let Some((first, _)) = pairs.first() else {
        return Ok(());
    };
    let device = first.device().as_cuda_device()?.clone();
    let mut copies = Vec::new();
    let mut widened: [(DType, Vec<Entry>); 2] =
        [(DType::BF16, Vec::new()), (DType::F16, Vec::new())];
    for (src, dst) in pairs {
        let e = entry(src, dst)?;
        match widened
            .iter_mut()
            .find(|(dtype, _)| e.widened && *dtype == src.dtype())
        {
            Some((_, of_dtype)) => of_dtype.push(e),
            None if e.widened => bail!("copy_tensors: cannot widen {:?}", src.dtype()),
            None => copies.push(e),
        }
    }
    for (dtype, of_dtype) in &mut widened {
        if of_dtype.is_empty() {
            continue;
        }
        of_dtype.append(&mut copies);
        let kernel = match dtype {
            DType::BF16 => "multi_copy_widen_bf16",
            _ => "multi_copy_widen_f16",
        };
        launch_lists(&device, kernel, of_dtype)?;
    }
    launch_lists(&device, "multi_copy", &copies)
}

/// `kernel` over `entries`, [`MAX_TENSORS`] a launch.
fn launch_lists(device: &CudaDevice, kernel: &'static str, entries: &[Entry]) -> Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let func = function_named(device, &MULTI_TENSOR, kernel)?;
    for chunk in entries.chunks(MAX_TENSORS) {
        let list = TensorList::new(chunk);
        let mut builder = func.builder();
        builder.arg(&list);
        // SAFETY: every entry names `len` valid bytes (a copy) or elements (16-bit source, f32
        // destination) at both addresses: contiguous tensors of as many elements, alive until
        // the kernel has run (see the module docs).
        launched(kernel, unsafe { builder.launch(config(chunk)) })?;
    }
    Ok(())
}
