//! Launches the kernels of `kernels/multi_tensor.cu`: the tensors' device addresses travel by
//! value in a [`TensorList`] of at most [`MAX_TENSORS`] entries, one launch per list. The
//! kernels write through addresses of storages only borrowed for reading (see
//! [`device_address`] for why that is sound). A channels-last 4-D source (a convolution's weight
//! gradient on the NHWC path) is transposed into its contiguous destination by the same launch.

use candle_core::cuda_backend::CudaDevice;
use candle_core::{bail, DType, Result, Tensor};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::channels_last::{is_channels_last, nhwc};
use super::cuda_launch::{device_address, function_named, launched, MULTI_TENSOR, THREADS};

/// Entries of one [`TensorList`] (as `MAX_TENSORS` in the kernel source).
const MAX_TENSORS: usize = 48;

/// The kernel's by-value argument: per tensor two addresses, a length (bytes for a contiguous
/// copy, elements when widened or transposed), whether it is widened, its element size, and
/// for a channels-last source its pixels per channel and channels (0 pixels: contiguous).
#[repr(C)]
#[derive(Clone, Copy)]
struct TensorList {
    a: [u64; MAX_TENSORS],
    b: [u64; MAX_TENSORS],
    len: [u64; MAX_TENSORS],
    widened: [u8; MAX_TENSORS],
    elem_bytes: [u8; MAX_TENSORS],
    pixels: [u32; MAX_TENSORS],
    channels: [u32; MAX_TENSORS],
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
    elem_bytes: u8,
    /// `(pixels, channels)` of a channels-last source.
    transposed: Option<(u32, u32)>,
}

impl Entry {
    /// Blocks of [`THREADS`] that cover the entry at one 16-byte load a thread (one element a
    /// thread when transposed).
    fn blocks(&self) -> u64 {
        let per_block = match (self.transposed, self.widened) {
            (Some(_), _) => THREADS as u64,
            (None, true) => 8 * THREADS as u64,
            (None, false) => 16 * THREADS as u64,
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
            elem_bytes: [0; MAX_TENSORS],
            pixels: [0; MAX_TENSORS],
            channels: [0; MAX_TENSORS],
            count: entries.len() as u32,
        };
        for (i, e) in entries.iter().enumerate() {
            (list.a[i], list.b[i], list.len[i]) = (e.dst, e.src, e.len);
            list.widened[i] = u8::from(e.widened);
            list.elem_bytes[i] = e.elem_bytes;
            (list.pixels[i], list.channels[i]) = e.transposed.unwrap_or((0, 0));
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

/// `(pixels, channels)` of `src` when the kernels take it as a channels-last source: stored
/// channels-last, with fewer than 2^32 elements (the kernels index it in 32 bits).
pub(crate) fn channels_last_source(src: &Tensor) -> Option<(u32, u32)> {
    let &[_, c, h, w] = src.dims() else {
        return None;
    };
    let small = u32::try_from(src.elem_count()).is_ok();
    (small && is_channels_last(src)).then_some(((h * w) as u32, c as u32))
}

/// The entry of `dst ← src`: a byte copy of the same dtype, or 16-bit elements widened into an
/// f32 `dst` (as many elements; checked by the caller); either transposed from a channels-last
/// `src` ([`channels_last_source`]), any other `src` contiguous.
fn entry(src: &Tensor, dst: &Tensor) -> Result<Entry> {
    let widened = src.dtype() != dst.dtype();
    if widened && dst.dtype() != DType::F32 {
        bail!("copy_tensors: widening into {:?}, not f32", dst.dtype());
    }
    let transposed = channels_last_source(src);
    let len = match widened || transposed.is_some() {
        true => dst.elem_count(),
        false => dst.elem_count() * dst.dtype().size_in_bytes(),
    };
    let src = match transposed {
        Some(_) => nhwc(src)?,
        None => src.clone(),
    };
    Ok(Entry {
        dst: device_address(dst)?,
        src: device_address(&src)?,
        len: len as u64,
        widened,
        elem_bytes: src.dtype().size_in_bytes() as u8,
        transposed,
    })
}

/// `dst ← src` for each pair (contiguous or channels-last sources, contiguous destinations,
/// as many elements, same dtype or a 16-bit source and an f32 destination: checked by the
/// caller): one launch per [`MAX_TENSORS`] pairs,
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
        // SAFETY: every entry names `len` valid bytes (a copy) or elements (widened or
        // transposed) at both addresses: tensors of as many elements, contiguous in memory (a
        // channels-last source as its NHWC view), alive until the kernel has run (see the
        // module docs).
        launched(kernel, unsafe { builder.launch(config(chunk)) })?;
    }
    Ok(())
}
