//! Launches `kernels/rotary.cu`'s rotation of a packed q | k | v projection (f32, bf16, f16),
//! a block of 256 threads a row.

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use half::{bf16, f16};

use super::cuda_launch::{device_of, function, launched, output, view, ROTARY};
use super::packed_attention::PackedHeads;

fn launch<T: CudaDType + DeviceRepr + WithDType>(
    heads: PackedHeads,
    sign: f32,
    (qkv, layout): (&CudaStorage, &Layout),
    (inverse, inverse_layout): (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let name = "rotary_packed";
    let (b, seq, width) = layout.shape().dims3()?;
    let d = heads.head_dim;
    if width != heads.row_width() || inverse_layout.shape().dims() != [d / 2] {
        bail!("{name}: rows of {width} for {heads:?}");
    }
    let device = device_of(qkv);
    let x = view::<T>(qkv, layout, name)?;
    let inv = view::<f32>(inverse, inverse_layout, name)?;
    let len = b * seq * width;
    let out = output::<T>(&device, len)?;
    let func = function(&device, &ROTARY, name, T::DTYPE)?;
    let int = |v: usize| {
        i32::try_from(v).map_err(|_| candle_core::Error::Msg(format!("{name}: {v} too large")))
    };
    let rows = (b * seq) as i64;
    let (seq, width) = (int(seq)?, int(width)?);
    let (rotated, d) = (int((heads.heads + heads.kv_heads) * d)?, int(d)?);
    let mut builder = func.builder();
    builder
        .arg(&x)
        .arg(&inv)
        .arg(&out)
        .arg(&rows)
        .arg(&seq)
        .arg(&width);
    builder.arg(&rotated).arg(&d).arg(&sign);
    // A block per row (at most 65535 · 8 blocks, which loop over the rest), 256 threads.
    let config = LaunchConfig {
        grid_dim: ((rows as usize).clamp(1, 65_535 * 8) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `rotary_packed_{f32,bf16,f16}` in kernels/rotary.cu; qkv and
    // the output hold `rows × width` elements, the inverse frequencies d / 2 (checked above),
    // and the kernel writes every element of the output.
    launched(name, unsafe { builder.launch(config) })?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// `qkv` rotated by `sign` times its positions' angles.
pub(crate) fn run(
    heads: PackedHeads,
    sign: f32,
    qkv: (&CudaStorage, &Layout),
    inverse: (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    if inverse.0.dtype() != DType::F32 {
        bail!(
            "rotary_packed: f32 inverse frequencies, not {:?}",
            inverse.0.dtype()
        );
    }
    match qkv.0.dtype() {
        DType::F32 => launch::<f32>(heads, sign, qkv, inverse),
        DType::BF16 => launch::<bf16>(heads, sign, qkv, inverse),
        DType::F16 => launch::<f16>(heads, sign, qkv, inverse),
        other => bail!("rotary_packed: dtype {other:?} has no CUDA kernel"),
    }
}
