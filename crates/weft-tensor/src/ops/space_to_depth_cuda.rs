//! Launches `space_to_depth` of `kernels/space_to_depth.cu`: a grid-stride loop, a thread per
//! block of 2 x 2 pixels.

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{DeviceRepr, PushKernelArg};
use half::{bf16, f16};

use super::conv_space_to_depth::BlockGeometry;
use super::cuda_launch::{
    device_of, function, grid_stride, launched, output, view, SPACE_TO_DEPTH,
};

fn launch<T: CudaDType + DeviceRepr + WithDType>(
    (storage, layout): (&CudaStorage, &Layout),
    g: BlockGeometry,
) -> Result<CudaStorage> {
    let name = "space_to_depth";
    let device = device_of(storage);
    let x = view::<T>(storage, layout, name)?;
    let len = g.blocks_len();
    let blocks = len / 16;
    if blocks > i32::MAX as usize {
        bail!("space_to_depth: {blocks} blocks exceed the kernel's 32-bit block index");
    }
    let out = output::<T>(&device, len)?;
    let func = function(&device, &SPACE_TO_DEPTH, name, T::DTYPE)?;
    let mut builder = func.builder();
    builder.arg(&x).arg(&out);
    let dims = [g.n, g.h, g.w, g.c, g.bh, g.bw, g.padding].map(|d| d as i32);
    for d in &dims {
        builder.arg(d);
    }
    // SAFETY: the arguments match kernels/space_to_depth.cu; `x` holds n x h x w x c elements
    // (the op checked its shape) and the kernel writes every element of the output.
    launched(name, unsafe { builder.launch(grid_stride(blocks)) })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// The blocks of contiguous NHWC `input`.
pub(crate) fn blocks(input: (&CudaStorage, &Layout), g: BlockGeometry) -> Result<CudaStorage> {
    match input.0.dtype() {
        DType::F32 => launch::<f32>(input, g),
        DType::F64 => launch::<f64>(input, g),
        DType::BF16 => launch::<bf16>(input, g),
        DType::F16 => launch::<f16>(input, g),
        other => bail!("space_to_depth: dtype {other:?} has no CUDA kernel"),
    }
}
