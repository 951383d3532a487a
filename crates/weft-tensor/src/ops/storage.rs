//! Shared plumbing for the custom ops: which tensors take weft's CPU or CUDA kernels, the
//! float types the kernels are written for, and safe access to contiguous CPU storage.

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, DType, Layout, Result, Tensor, WithDType};

/// The element types the CPU kernels support (the `gemm` crate handles exactly these).
pub(crate) trait Float: WithDType + bytemuck::Pod {
    /// Additive identity.
    const ZERO: Self;
    /// Negative infinity, the identity of max pooling.
    const NEG_INFINITY: Self;
    /// Not-a-number.
    const NAN: Self;
    /// Whether the value is NaN.
    fn is_nan(self) -> bool;
}

impl Float for f32 {
    const ZERO: Self = 0.0;
    const NEG_INFINITY: Self = f32::NEG_INFINITY;
    const NAN: Self = f32::NAN;
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
}

impl Float for f64 {
    const ZERO: Self = 0.0;
    const NEG_INFINITY: Self = f64::NEG_INFINITY;
    const NAN: Self = f64::NAN;
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
}

/// True when every tensor lives on the CPU with dtype f32 or f64, so the custom CPU
/// kernels apply; otherwise the public functions fall back to Candle's own ops.
pub(crate) fn uses_cpu_kernels(tensors: &[&Tensor]) -> bool {
    tensors
        .iter()
        .all(|t| t.device().is_cpu() && matches!(t.dtype(), DType::F32 | DType::F64))
}

/// True when every tensor is 16-bit (bf16 or f16) on the CPU: the ops then compute in f32
/// inside (Candle's CPU matmul has no 16-bit path) and round their outputs back.
pub(crate) fn half_on_cpu(tensors: &[&Tensor]) -> bool {
    tensors
        .iter()
        .all(|t| t.device().is_cpu() && matches!(t.dtype(), DType::BF16 | DType::F16))
}

static CUDA_KERNELS: AtomicBool = AtomicBool::new(true);

/// Turns weft's CUDA kernels (batch norm, ReLU, max-pool: `kernels/`) on or off for the whole
/// process; on by default. Off, CUDA tensors take Candle's ops instead (to compare speed, or
/// to rule the kernels out while debugging). Convolutions are not affected.
pub fn set_cuda_kernels(enabled: bool) {
    CUDA_KERNELS.store(enabled, Ordering::Relaxed);
}

/// True when every tensor is f32/f64 on a CUDA device, in a `cuda` build with the kernels on.
pub(crate) fn uses_cuda_kernels(tensors: &[&Tensor]) -> bool {
    cfg!(feature = "cuda")
        && CUDA_KERNELS.load(Ordering::Relaxed)
        && tensors
            .iter()
            .all(|t| t.device().is_cuda() && matches!(t.dtype(), DType::F32 | DType::F64))
}

/// Whether weft's kernels cover every op of a convolutional block (convolution, batch norm,
/// ReLU, max-pool) for tensors like `t`: f32/f64 on the CPU, or on a GPU in a build with the
/// `cudnn` feature and the CUDA kernels on. Blocks differentiate themselves only then.
pub fn has_kernels(t: &Tensor) -> bool {
    uses_cpu_kernels(&[t]) || (cfg!(feature = "cudnn") && uses_cuda_kernels(&[t]))
}

/// One argument of a CPU custom op: its storage, layout and name (for error messages).
#[derive(Clone, Copy)]
pub(crate) struct Arg<'a> {
    pub storage: &'a CpuStorage,
    pub layout: &'a Layout,
    pub name: &'static str,
}

impl<'a> Arg<'a> {
    pub(crate) fn new(storage: &'a CpuStorage, layout: &'a Layout, name: &'static str) -> Self {
        Self {
            storage,
            layout,
            name,
        }
    }
}

/// A CPU kernel written once for every supported float type.
pub(crate) trait CpuKernel {
    /// Runs on the contiguous argument slices, all of element type `T`.
    fn run<T: Float>(&self, args: &[&[T]]) -> Result<Vec<T>>;
}

/// Runs `kernel` on the arguments of custom op `op`, dispatching on their (common) dtype.
pub(crate) fn run_kernel<K: CpuKernel>(
    kernel: &K,
    op: &str,
    args: &[Arg<'_>],
) -> Result<CpuStorage> {
    match args.first().map(|a| a.storage) {
        Some(CpuStorage::F32(_)) => Ok(CpuStorage::F32(kernel.run(&slices(op, args)?)?)),
        Some(CpuStorage::F64(_)) => Ok(CpuStorage::F64(kernel.run(&slices(op, args)?)?)),
        Some(other) => bail!(
            "{op}: CPU kernel supports f32 and f64, got {:?}",
            other.dtype()
        ),
        None => bail!("{op}: CPU kernel called without arguments"),
    }
}

/// The contiguous element slices of all arguments, or an error naming the bad one.
fn slices<'a, T: WithDType>(op: &str, args: &[Arg<'a>]) -> Result<Vec<&'a [T]>> {
    args.iter()
        .map(|arg| {
            let Ok(data) = T::cpu_storage_as_slice(arg.storage) else {
                bail!(
                    "{op}: argument `{}` has dtype {:?}, expected {:?}",
                    arg.name,
                    arg.storage.dtype(),
                    T::DTYPE
                );
            };
            match arg.layout.contiguous_offsets() {
                Some((start, end)) => Ok(&data[start..end]),
                None => bail!(
                    "{op}: argument `{}` must be contiguous, got {:?}",
                    arg.name,
                    arg.layout
                ),
            }
        })
        .collect()
}

/// The four dimensions of a rank-4 argument, or an error naming the op and argument.
pub(crate) fn dims4(dims: &[usize], op: &str, arg: &str) -> Result<(usize, usize, usize, usize)> {
    match dims {
        &[a, b, c, d] => Ok((a, b, c, d)),
        _ => bail!("{op}: argument `{arg}` must have rank 4, got shape {dims:?}"),
    }
}
