//! Plumbing shared by the launchers of weft's CUDA kernels (`kernels/*.cu`, compiled to PTX by
//! this crate's build script and embedded here; other crates bring their own PTX as a
//! [`Module`]): the modules, tensors' device addresses, typed views of Candle's CUDA storages,
//! output allocation and launch configurations.

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use std::sync::Arc;

use candle_core::cuda_backend::CudaDevice;
use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::{bail, DType, Layout, Result, Storage, Tensor};
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, DevicePtr, DeviceRepr, LaunchArgs, LaunchConfig,
};

include!(concat!(env!("OUT_DIR"), "/ptx.rs"));

/// One PTX module: a name unique in the process and its source, compiled once for each compute
/// capability the build targeted (ascending).
pub struct Module {
    name: &'static str,
    ptx: &'static [(u32, &'static str)],
}

impl Module {
    pub const fn new(name: &'static str, ptx: &'static [(u32, &'static str)]) -> Self {
        Self { name, ptx }
    }

    /// The PTX for a GPU of compute capability `cap` (`major * 10 + minor`): the highest
    /// capability built not above it (the driver compiles it for the GPU); an error naming
    /// both when the build targeted only newer GPUs.
    pub fn ptx_for(&self, cap: u32) -> Result<&'static str> {
        match self.ptx.iter().rev().find(|(built, _)| *built <= cap) {
            Some((_, ptx)) => Ok(ptx),
            None => {
                let built: Vec<String> = self.ptx.iter().map(|(c, _)| format_cap(*c)).collect();
                bail!(
                    "weft's CUDA kernels were built for compute capability {} and this GPU is {}: rebuild with CUDA_COMPUTE_CAP={cap}",
                    built.join(", "),
                    format_cap(cap)
                )
            }
        }
    }
}

/// `90` as `9.0`.
fn format_cap(cap: u32) -> String {
    format!("{}.{}", cap / 10, cap % 10)
}

/// The compute capability of `device`'s GPU, `major * 10 + minor`.
pub fn compute_cap(device: &CudaDevice) -> Result<u32> {
    use cudarc::driver::sys::CUdevice_attribute::{
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as MAJOR,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR as MINOR,
    };
    let context = device.cuda_stream().context().clone();
    let read = |attribute| {
        context
            .attribute(attribute)
            .map_err(|e| candle_core::Error::Msg(format!("compute capability: {e:?}")))
    };
    Ok((read(MAJOR)? * 10 + read(MINOR)?) as u32)
}

pub(crate) const ATTENTION: Module = Module {
    name: "weft_attention",
    ptx: PTX_ATTENTION,
};
#[cfg(feature = "cudnn")]
pub(crate) const ATTENTION_DROPOUT: Module = Module {
    name: "weft_attention_dropout",
    ptx: PTX_ATTENTION_DROPOUT,
};
pub(crate) const DROPOUT: Module = Module {
    name: "weft_dropout",
    ptx: PTX_DROPOUT,
};
pub(crate) const BIAS: Module = Module {
    name: "weft_bias",
    ptx: PTX_BIAS,
};
pub(crate) const RESIDUAL: Module = Module {
    name: "weft_residual",
    ptx: PTX_RESIDUAL,
};
pub(crate) const CROSS_ENTROPY: Module = Module {
    name: "weft_cross_entropy",
    ptx: PTX_CROSS_ENTROPY,
};
pub(crate) const EMBEDDING: Module = Module {
    name: "weft_embedding",
    ptx: PTX_EMBEDDING,
};
pub(crate) const GELU: Module = Module {
    name: "weft_gelu",
    ptx: PTX_GELU,
};
pub(crate) const ROTARY: Module = Module {
    name: "weft_rotary",
    ptx: PTX_ROTARY,
};
pub(crate) const SWIGLU: Module = Module {
    name: "weft_swiglu",
    ptx: PTX_SWIGLU,
};
pub(crate) const LAYER_NORM: Module = Module {
    name: "weft_layer_norm",
    ptx: PTX_LAYER_NORM,
};
pub(crate) const BATCH_NORM: Module = Module {
    name: "weft_batch_norm",
    ptx: PTX_BATCH_NORM,
};
pub(crate) const BATCH_NORM_NHWC: Module = Module {
    name: "weft_batch_norm_nhwc",
    ptx: PTX_BATCH_NORM_NHWC,
};
pub(crate) const BATCH_NORM_SYNC: Module = Module {
    name: "weft_batch_norm_sync",
    ptx: PTX_BATCH_NORM_SYNC,
};
pub(crate) const TRANSPOSE: Module = Module {
    name: "weft_transpose",
    ptx: PTX_TRANSPOSE,
};
pub(crate) const PIXELS: Module = Module {
    name: "weft_pixels",
    ptx: PTX_PIXELS,
};
/// Launched by `space_to_depth_cuda`, a cuDNN path.
#[cfg(feature = "cudnn")]
pub(crate) const SPACE_TO_DEPTH: Module = Module {
    name: "weft_space_to_depth",
    ptx: PTX_SPACE_TO_DEPTH,
};
/// Launched by `device_timing`.
#[cfg(feature = "cudnn")]
pub(crate) const HOLD: Module = Module {
    name: "weft_hold",
    ptx: PTX_HOLD,
};
pub(crate) const RELU: Module = Module {
    name: "weft_relu",
    ptx: PTX_RELU,
};
pub(crate) const MAX_POOL: Module = Module {
    name: "weft_max_pool",
    ptx: PTX_MAX_POOL,
};
pub(crate) const MAX_POOL_NHWC: Module = Module {
    name: "weft_max_pool_nhwc",
    ptx: PTX_MAX_POOL_NHWC,
};
pub(crate) const MULTI_TENSOR: Module = Module {
    name: "weft_multi_tensor",
    ptx: PTX_MULTI_TENSOR,
};

pub(crate) const UNSCALE: Module = Module {
    name: "weft_unscale",
    ptx: PTX_UNSCALE,
};

/// Threads per block of every weft kernel.
pub const THREADS: u32 = 256;

/// A loaded kernel and the stream it launches on (the device's compute stream).
pub struct Kernel {
    func: CudaFunction,
    stream: Arc<CudaStream>,
}

impl Kernel {
    /// A launch of this kernel; push its arguments in the kernel's order.
    pub fn builder(&self) -> LaunchArgs<'_> {
        self.stream.launch_builder(&self.func)
    }

    /// Asks for the largest shared-memory share of each SM's on-chip memory for this kernel:
    /// its blocks' shared memory, not their L1 cache, bounds how many an SM holds (the
    /// streamed batch-norm passes, `kernels/row_stream.cuh`).
    pub fn prefer_shared_memory(&self) -> Result<()> {
        use cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT as CARVEOUT;
        self.func
            .set_attribute(CARVEOUT, 100)
            .map_err(|e| candle_core::Error::Msg(format!("kernel attribute: {e:?}")))
    }
}

/// The `{kernel}_{f32|f64|bf16|f16}` function of `module` for element type `dtype` (an error
/// from the driver names a kernel not written for that type).
pub(crate) fn function(
    device: &CudaDevice,
    module: &Module,
    kernel: &str,
    dtype: DType,
) -> Result<Kernel> {
    let suffix = match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        other => bail!("{kernel}: dtype {other:?} is not supported on CUDA"),
    };
    function_named(device, module, &format!("{kernel}_{suffix}"))
}

/// The function `name` of `module`.
pub fn function_named(device: &CudaDevice, module: &Module, name: &str) -> Result<Kernel> {
    let ptx = module.ptx_for(compute_cap(device)?)?;
    let func = device
        .get_or_load_custom_func(name, module.name, ptx)?
        .into_cuda_function();
    Ok(Kernel {
        func,
        stream: device.cuda_stream(),
    })
}

/// The elements of a contiguous argument as a typed device view.
pub(crate) fn view<'a, T: CudaDType>(
    storage: &'a CudaStorage,
    layout: &Layout,
    name: &str,
) -> Result<CudaView<'a, T>> {
    if !layout.is_contiguous() {
        bail!("CUDA kernel: `{name}` must be contiguous");
    }
    let start = layout.start_offset();
    Ok(storage
        .as_cuda_slice::<T>()?
        .slice(start..start + layout.shape().elem_count()))
}

/// An output of `len` elements that the kernel writes completely.
pub(crate) fn output<T: DeviceRepr>(device: &CudaDevice, len: usize) -> Result<CudaSlice<T>> {
    // SAFETY: callers launch a kernel that writes every element before anything reads it.
    unsafe { device.alloc::<T>(len) }
}

/// The device of the first argument.
pub(crate) fn device_of(storage: &CudaStorage) -> CudaDevice {
    storage.device().clone()
}

/// A grid-stride launch over `total` elements.
pub(crate) fn grid_stride(total: usize) -> LaunchConfig {
    grid_stride_of(total, THREADS)
}

/// [`grid_stride`] with blocks of `threads` threads.
pub(crate) fn grid_stride_of(total: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            (total as u64).div_ceil(threads as u64).clamp(1, 65_535 * 8) as u32,
            1,
            1,
        ),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Turns a launch's outcome into an error naming the kernel.
pub fn launched<T>(
    kernel: &str,
    result: std::result::Result<T, cudarc::driver::DriverError>,
) -> Result<()> {
    result
        .map(drop)
        .map_err(|e| candle_core::Error::Msg(format!("CUDA kernel {kernel}: {e:?}")))
}

/// The device address of a contiguous CUDA tensor's first element. A kernel may write through
/// it although the storage is only borrowed for reading (a parameter is a Candle `Var`): the
/// host never touches device memory, and every weft kernel runs on the device's compute
/// stream, ordered after all work already queued on the tensor; a tensor dropped right after
/// the launch is freed stream-ordered (`cuMemFreeAsync`) after the kernel.
pub fn device_address(tensor: &Tensor) -> Result<u64> {
    let (storage, layout) = tensor.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        bail!("CUDA kernels: a tensor is not on a CUDA device");
    };
    if !layout.is_contiguous() {
        bail!("CUDA kernels: tensors must be contiguous");
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
        _ => bail!("CUDA kernels: dtype {:?} is not supported", cuda.dtype()),
    };
    Ok(base + (layout.start_offset() * tensor.dtype().size_in_bytes()) as u64)
}
