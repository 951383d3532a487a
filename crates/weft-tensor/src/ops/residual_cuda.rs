//! Launches the residual sums on contiguous 16-bit CUDA tensors: `add_bias_residual` of
//! `kernels/bias.cu` in its bias add's geometry (a thread per unit of 8 columns, or per column
//! at a ragged width; rows across the block's second dimension and the grid's), `residual_add`
//! of `kernels/residual.cu` grid-striding over units of 8 elements.

use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::op::BackpropOp;
use candle_core::{bail, DType, Result, Storage, Tensor, WithDType};
use cudarc::driver::{DeviceRepr, PushKernelArg};
use half::{bf16, f16};

use super::cuda_launch::{
    device_of, function, grid_stride, launched, output, view, BIAS, RESIDUAL,
};

/// `x + b + r` over the rows of `x`.
pub(crate) fn add_bias_residual(x: &Tensor, b: &Tensor, r: &Tensor) -> Result<Tensor> {
    match x.dtype() {
        DType::BF16 => bias_residual::<bf16>(x, b, r),
        DType::F16 => bias_residual::<f16>(x, b, r),
        other => bail!("add_bias_residual: dtype {other:?} has no CUDA kernel"),
    }
}

/// `a + b`, elementwise.
pub(crate) fn residual_add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    match a.dtype() {
        DType::BF16 => add::<bf16>(a, b),
        DType::F16 => add::<f16>(a, b),
        other => bail!("residual_add: dtype {other:?} has no CUDA kernel"),
    }
}

fn bias_residual<T: CudaDType + DeviceRepr + WithDType>(
    x: &Tensor,
    b: &Tensor,
    r: &Tensor,
) -> Result<Tensor> {
    let name = "add_bias_residual";
    let (rows, cols) = x.dims2()?;
    let (Ok(rows32), Ok(cols32)) = (i32::try_from(rows), i32::try_from(cols)) else {
        bail!("{name}: {rows} x {cols} is beyond the kernel's int indices");
    };
    let (x, b, r) = (x.contiguous()?, b.contiguous()?, r.contiguous()?);
    let (xs, xl) = x.storage_and_layout();
    let (bs, bl) = b.storage_and_layout();
    let (rs, rl) = r.storage_and_layout();
    let (Storage::Cuda(xc), Storage::Cuda(bc), Storage::Cuda(rc)) = (&*xs, &*bs, &*rs) else {
        bail!("{name}: tensors on different devices");
    };
    let device = device_of(xc);
    let (xv, bv, rv) = (
        view::<T>(xc, xl, name)?,
        view::<T>(bc, bl, name)?,
        view::<T>(rc, rl, name)?,
    );
    let out = output::<T>(&device, rows * cols)?;
    let func = function(&device, &BIAS, name, T::DTYPE)?;
    let mut builder = func.builder();
    builder
        .arg(&xv)
        .arg(&bv)
        .arg(&rv)
        .arg(&out)
        .arg(&rows32)
        .arg(&cols32);
    let config = super::bias_cuda::geometry(T::DTYPE, rows, cols);
    // SAFETY: the arguments match kernels/bias.cu's add_bias_residual; x and r hold rows × cols elements and
    // b cols (checked by the op); the threads cover every unit of columns and the rows stride
    // over all rows, so every element of the output is written.
    launched(name, unsafe { builder.launch(config) })?;
    let storage = CudaStorage::wrap_cuda_slice(out, device);
    Ok(Tensor::from_storage(
        Storage::Cuda(storage),
        (rows, cols),
        BackpropOp::none(),
        false,
    ))
}

fn add<T: CudaDType + DeviceRepr + WithDType>(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let name = "residual_add";
    let (a, b) = (a.contiguous()?, b.contiguous()?);
    let n = a.elem_count();
    let (as_, al) = a.storage_and_layout();
    let (bs, bl) = b.storage_and_layout();
    let (Storage::Cuda(ac), Storage::Cuda(bc)) = (&*as_, &*bs) else {
        bail!("{name}: tensors on different devices");
    };
    let device = device_of(ac);
    let (av, bv) = (view::<T>(ac, al, name)?, view::<T>(bc, bl, name)?);
    let out = output::<T>(&device, n)?;
    let func = function(&device, &RESIDUAL, name, T::DTYPE)?;
    let mut builder = func.builder();
    let n64 = n as i64;
    builder.arg(&av).arg(&bv).arg(&out).arg(&n64);
    // SAFETY: the arguments match kernels/residual.cu; a and b hold n elements each; the grid
    // strides over every unit of 8 and its first threads write the tail, so every element of
    // the output is written (a grid of at least 8 threads: `grid_stride` gives 256 at least).
    launched(name, unsafe { builder.launch(grid_stride(n.div_ceil(8))) })?;
    let storage = CudaStorage::wrap_cuda_slice(out, device);
    Ok(Tensor::from_storage(
        Storage::Cuda(storage),
        a.shape().clone(),
        BackpropOp::none(),
        false,
    ))
}
