//! [`blend_into`]: `running = (1 - momentum) * running + momentum * scale * batch`, in place,
//! in one pass: batch norm's running statistics (`scale` turns the biased batch variance into
//! the unbiased one). Arithmetic in f64 on CPU and GPU alike (`kernels/batch_norm.cu`).

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, InplaceOp2, Layout, Result, Tensor};

use super::storage::{uses_cpu_kernels, uses_cuda_kernels, Float};

/// Blends `batch` into `running` (same length and dtype) in place.
pub fn blend_into(running: &Tensor, batch: &Tensor, momentum: f64, scale: f64) -> Result<()> {
    if running.elem_count() != batch.elem_count() || running.dtype() != batch.dtype() {
        bail!(
            "blend_into: running {:?} {:?} and batch {:?} {:?} differ",
            running.dims(),
            running.dtype(),
            batch.dims(),
            batch.dtype()
        );
    }
    let tensors = [running, batch];
    if uses_cpu_kernels(&tensors) || uses_cuda_kernels(&tensors) {
        return running.inplace_op2(&batch.contiguous()?, &Blend { momentum, scale });
    }
    let value =
        ((running * (1.0 - momentum))? + (batch.reshape(running.shape())? * (momentum * scale))?)?;
    running.slice_set(&value, 0, 0)
}

struct Blend {
    momentum: f64,
    scale: f64,
}

impl Blend {
    fn apply<T: Float>(&self, running: &mut [T], batch: &[T]) {
        for (r, b) in running.iter_mut().zip(batch) {
            *r = T::from_f64(
                (1.0 - self.momentum) * r.to_f64() + self.momentum * self.scale * b.to_f64(),
            );
        }
    }
}

fn range(layout: &Layout, what: &str) -> Result<std::ops::Range<usize>> {
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(start..end),
        None => bail!("blend_into: `{what}` must be contiguous"),
    }
}

impl InplaceOp2 for Blend {
    fn name(&self) -> &'static str {
        "weft-blend-running"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dst_l: &Layout,
        src: &CpuStorage,
        src_l: &Layout,
    ) -> Result<()> {
        let (dst_r, src_r) = (range(dst_l, "running")?, range(src_l, "batch")?);
        match (dst, src) {
            (CpuStorage::F32(d), CpuStorage::F32(s)) => self.apply(&mut d[dst_r], &s[src_r]),
            (CpuStorage::F64(d), CpuStorage::F64(s)) => self.apply(&mut d[dst_r], &s[src_r]),
            _ => bail!("blend_into: f32 or f64 tensors of one dtype expected"),
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        dst: &mut CudaStorage,
        dst_l: &Layout,
        src: &CudaStorage,
        src_l: &Layout,
    ) -> Result<()> {
        super::batch_norm_cuda::blend_running(
            dst,
            range(dst_l, "running")?,
            (src, src_l),
            self.momentum,
            self.scale,
        )
    }
}
