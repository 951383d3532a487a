//! Launches the cross-entropy kernels of `kernels/cross_entropy.cu`: the forward with one block
//! of 256 threads per row, the backward grid-stride over the logits' elements. Logits of type
//! `T` are computed in `A` (f32 for bf16), whose type the targets, the statistics and the
//! forward's `[loss | lse | hit]` have; the backward writes the gradient in `T`.

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use half::bf16;

use super::cross_entropy::Pass;
use super::cuda_launch::{device_of, function, grid_stride, launched, output, view, CROSS_ENTROPY};

/// Runs `pass` into `out` (`[loss | lse | hit]` of type `A` rows by three, or the gradient of
/// type `T` rows by columns).
fn launch<T, A, O>(
    pass: Pass,
    (rows, cols, classes): (usize, usize, usize),
    args: &[(&CudaStorage, &Layout); 3],
    out: &CudaSlice<O>,
) -> Result<()>
where
    T: CudaDType + DeviceRepr + WithDType,
    A: CudaDType + DeviceRepr + WithDType,
    O: DeviceRepr,
{
    let name = match pass {
        Pass::Forward => "cross_entropy_forward",
        Pass::Backward => "cross_entropy_backward",
    };
    let device = device_of(args[0].0);
    let logits = view::<T>(args[0].0, args[0].1, name)?;
    let targets = view::<A>(args[1].0, args[1].1, name)?;
    let stats = view::<A>(args[2].0, args[2].1, name)?;
    let func = function(&device, &CROSS_ENTROPY, name, T::DTYPE)?;
    let mut builder = func.builder();
    builder.arg(&logits).arg(&targets).arg(&stats);
    let to_i32 = |v: usize| {
        i32::try_from(v).map_err(|_| candle_core::Error::Msg(format!("{name}: {v} columns")))
    };
    let (n, c, k) = (rows as i64, to_i32(cols)?, to_i32(classes)?);
    builder.arg(out).arg(&n).arg(&c).arg(&k);
    let config = match pass {
        Pass::Forward => LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        },
        Pass::Backward => grid_stride(rows * cols),
    };
    // SAFETY: the arguments match the kernel's signature in kernels/cross_entropy.cu; the
    // logits hold `rows × cols` elements, the targets `rows`, the statistics `2 × rows`
    // (backward; checked by the op), and the kernel writes every element of `out`.
    launched(name, unsafe { builder.launch(config) })
}

/// `pass` for logits of type `T` computed in `A`.
fn run_typed<T, A>(
    pass: Pass,
    shape: (usize, usize, usize),
    args: &[(&CudaStorage, &Layout); 3],
) -> Result<CudaStorage>
where
    T: CudaDType + DeviceRepr + WithDType,
    A: CudaDType + DeviceRepr + WithDType,
{
    let device = device_of(args[0].0);
    let (rows, cols, _) = shape;
    match pass {
        Pass::Forward => {
            let out = output::<A>(&device, rows * 3)?;
            launch::<T, A, A>(pass, shape, args, &out)?;
            Ok(CudaStorage::wrap_cuda_slice(out, device))
        }
        Pass::Backward => {
            let out = output::<T>(&device, rows * cols)?;
            launch::<T, A, T>(pass, shape, args, &out)?;
            Ok(CudaStorage::wrap_cuda_slice(out, device))
        }
    }
}

/// Runs `pass` over `rows × cols` logits, `classes` of whose columns count.
pub(crate) fn run(
    pass: Pass,
    rows: usize,
    cols: usize,
    classes: usize,
    args: &[(&CudaStorage, &Layout); 3],
) -> Result<CudaStorage> {
    let shape = (rows, cols, classes);
    match args[0].0.dtype() {
        DType::F32 => run_typed::<f32, f32>(pass, shape, args),
        DType::F64 => run_typed::<f64, f64>(pass, shape, args),
        DType::BF16 => run_typed::<bf16, f32>(pass, shape, args),
        other => bail!("cross_entropy_rows: dtype {other:?} has no CUDA kernel"),
    }
}
