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

/// True when every tensor is 16-bit (bf16 or f16), on any device: the ops without 16-bit
/// kernels (the transformer's) then compute in f32 and round their outputs back once.
pub(crate) fn is_half(tensors: &[&Tensor]) -> bool {
    tensors
        .iter()
        .all(|t| matches!(t.dtype(), DType::BF16 | DType::F16))
}

/// `t` in f32 (exact for 16-bit values).
pub(crate) fn widen(t: &Tensor) -> Result<Tensor> {
    t.to_dtype(DType::F32)
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
    cuda_kernels_for(tensors, &[DType::F32, DType::F64])
}

/// The float types of the kernels written for 16-bit data too (ReLU, batch norm, max-pool,
/// convolutions): 16-bit values are computed in f32 inside, on the CPU and on CUDA alike.
pub(crate) const ANY_FLOAT: [DType; 4] = [DType::F32, DType::F64, DType::BF16, DType::F16];

/// True when every tensor is f32, f64, bf16 or f16 on a CUDA device, in a `cuda` build with
/// the kernels on: for the ops whose CUDA kernels have 16-bit versions.
pub(crate) fn uses_cuda_kernels_with_half(tensors: &[&Tensor]) -> bool {
    cuda_kernels_for(tensors, &ANY_FLOAT)
}

/// True when every tensor is bf16, or every one f16, on a CUDA device, in a `cuda` build with
/// the kernels on: for the ops whose CUDA kernels read and write 16-bit values themselves
/// (LayerNorm, the tanh GELU, the bias add) while their CPU side computes in f32.
pub(crate) fn uses_cuda_half_kernels(tensors: &[&Tensor]) -> bool {
    let dtype = tensors.first().map(|t| t.dtype());
    matches!(dtype, Some(DType::BF16 | DType::F16))
        && tensors.iter().all(|t| Some(t.dtype()) == dtype)
        && cuda_kernels_for(tensors, &[DType::BF16, DType::F16])
}

/// True when the tensors take the kernels with 16-bit versions, on the CPU (16-bit arguments
/// computed in f32 by [`run_kernel`]) or on CUDA.
pub(crate) fn uses_kernels_with_half(tensors: &[&Tensor]) -> bool {
    tensors
        .iter()
        .all(|t| t.device().is_cpu() && ANY_FLOAT.contains(&t.dtype()))
        || uses_cuda_kernels_with_half(tensors)
}

fn cuda_kernels_for(tensors: &[&Tensor], dtypes: &[DType]) -> bool {
    cfg!(feature = "cuda")
        && CUDA_KERNELS.load(Ordering::Relaxed)
        && tensors
            .iter()
            .all(|t| t.device().is_cuda() && dtypes.contains(&t.dtype()))
}

/// Whether weft's kernels cover every op of a convolutional block (convolution, batch norm,
/// ReLU, max-pool) for tensors like `t`: f32, f64, bf16 or f16 on the CPU, or on a GPU in a
/// build with the `cudnn` feature and the CUDA kernels on. Blocks differentiate themselves
/// only then.
pub fn has_kernels(t: &Tensor) -> bool {
    match t.device().is_cpu() {
        true => ANY_FLOAT.contains(&t.dtype()),
        false => cfg!(feature = "cudnn") && uses_cuda_kernels_with_half(&[t]),
    }
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

    /// Whether the result holds statistics, kept in f32 when the data is 16-bit (batch norm's
    /// tables); otherwise a 16-bit first argument's result is rounded back to its type.
    fn writes_statistics(&self) -> bool {
        false
    }
}

/// Runs `kernel` on the arguments of custom op `op`, dispatching on their (common) dtype.
/// When the first argument is bf16 or f16, every argument (16-bit data, f32 statistics) is
/// widened to f32 and the f32 kernel runs; the result is rounded back to the first argument's
/// type unless [`CpuKernel::writes_statistics`].
pub(crate) fn run_kernel<K: CpuKernel>(
    kernel: &K,
    op: &str,
    args: &[Arg<'_>],
) -> Result<CpuStorage> {
    match args.first().map(|a| a.storage) {
        Some(CpuStorage::F32(_)) => Ok(CpuStorage::F32(kernel.run(&slices(op, args)?)?)),
        Some(CpuStorage::F64(_)) => Ok(CpuStorage::F64(kernel.run(&slices(op, args)?)?)),
        Some(first @ (CpuStorage::BF16(_) | CpuStorage::F16(_))) => {
            let wide = args
                .iter()
                .map(|arg| widened(op, arg))
                .collect::<Result<Vec<_>>>()?;
            let views: Vec<&[f32]> = wide.iter().map(Vec::as_slice).collect();
            let out = kernel.run(&views)?;
            Ok(match (kernel.writes_statistics(), first) {
                (true, _) => CpuStorage::F32(out),
                (false, CpuStorage::BF16(_)) => {
                    CpuStorage::BF16(out.into_iter().map(half::bf16::from_f32).collect())
                }
                (false, _) => CpuStorage::F16(out.into_iter().map(half::f16::from_f32).collect()),
            })
        }
        Some(other) => bail!(
            "{op}: CPU kernel supports f32, f64, bf16 and f16, got {:?}",
            other.dtype()
        ),
        None => bail!("{op}: CPU kernel called without arguments"),
    }
}

/// A contiguous argument's elements as f32 (16-bit data or f32 statistics).
pub(crate) fn widened(op: &str, arg: &Arg<'_>) -> Result<Vec<f32>> {
    let Some((start, end)) = arg.layout.contiguous_offsets() else {
        bail!("{op}: argument `{}` must be contiguous", arg.name);
    };
    Ok(match arg.storage {
        CpuStorage::BF16(d) => d[start..end].iter().map(|v| v.to_f32()).collect(),
        CpuStorage::F16(d) => d[start..end].iter().map(|v| v.to_f32()).collect(),
        CpuStorage::F32(d) => d[start..end].to_vec(),
        other => bail!(
            "{op}: argument `{}` has dtype {:?} beside 16-bit data",
            arg.name,
            other.dtype()
        ),
    })
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
