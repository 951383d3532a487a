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

/// The kernel's by-value argument: per tensor two addresses and a length in bytes.
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
            Ok((device_address(dst)?, device_address(src)?, bytes))
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

/// `dst ← src` widened to f32 for each pair of a 16-bit `src` (bf16 or f16, one dtype per
/// call's run of pairs) and an f32 `dst` of as many elements (checked by the caller).
pub(crate) fn widen(pairs: &[(&Tensor, &Tensor)]) -> Result<()> {
    for dtype in [DType::BF16, DType::F16] {
        let of_dtype: Vec<_> = pairs.iter().filter(|(s, _)| s.dtype() == dtype).collect();
        let Some((first, _)) = of_dtype.first() else {
            continue;
        };
        let kernel = match dtype {
            DType::BF16 => "multi_widen_bf16",
            _ => "multi_widen_f16",
        };
        let device = device(first)?;
        let func = function_named(&device, &MULTI_TENSOR, kernel)?;
        let entries = of_dtype
            .iter()
            .map(|(src, dst)| {
                if dst.dtype() != DType::F32 {
                    bail!("{kernel}: the destination is {:?}, not f32", dst.dtype());
                }
                let len = dst.elem_count() as u64;
                Ok((device_address(dst)?, device_address(src)?, len))
            })
            .collect::<Result<Vec<_>>>()?;
        for chunk in entries.chunks(MAX_TENSORS) {
            let list = TensorList::new(chunk);
            let mut builder = func.builder();
            builder.arg(&list);
            // SAFETY: every entry names `len` valid elements at both addresses (contiguous
            // tensors of as many elements, 16-bit source and f32 destination, alive until the
            // kernel has run: see the module docs).
            launched(kernel, unsafe {
                builder.launch(config(chunk, 8 * THREADS as u64, chunk.len()))
            })?;
        }
    }
    Ok(())
}
