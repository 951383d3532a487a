//! [`blend_into`]: `running = (1 - momentum) * running + momentum * scale * batch`, in place,
//! in one pass: batch norm's running statistics (`scale` turns the biased batch variance into
//! the unbiased one). Arithmetic in f64 on CPU and GPU alike (`kernels/batch_norm.cu`). 16-bit
//! running statistics take f32 batch statistics (batch norm's own for 16-bit data).
//! [`update_running_stats`] does a batch norm's whole update (mean, variance, batch count): on
//! CUDA in one launch.

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, DType, InplaceOp2, Layout, Result, Tensor};

use super::storage::{uses_kernels_with_half, Float};

/// Whether batch statistics of dtype `batch` blend into running statistics of `running`: the
/// same dtype, or f32 into 16-bit.
fn blends(running: DType, batch: DType) -> bool {
    running == batch || (matches!(running, DType::BF16 | DType::F16) && batch == DType::F32)
}

/// One batch norm's running statistics, updated in place by [`update_running_stats`].
#[derive(Clone, Copy)]
pub struct RunningStats<'a> {
    pub mean: &'a Tensor,
    pub var: &'a Tensor,
    /// The batches counted so far (`num_batches_tracked`: one i64).
    pub count: &'a Tensor,
}

/// A training batch's statistics into `stats`: the mean blended with `batch_mean`, the
/// variance with `batch_var` times `var_scale` (each as [`blend_into`]), the count raised by
/// one. On CUDA one launch; elsewhere the two blends and an add.
pub fn update_running_stats(
    stats: RunningStats,
    batch_mean: &Tensor,
    batch_var: &Tensor,
    momentum: f64,
    var_scale: f64,
) -> Result<()> {
    #[cfg(feature = "cuda")]
    if super::storage::uses_cuda_kernels_with_half(&[stats.mean, stats.var, batch_mean, batch_var])
        && stats.count.device().is_cuda()
        && stats.mean.dtype() == stats.var.dtype()
        && stats.count.dtype() == DType::I64
    {
        let as_batch = |running: &Tensor, batch: &Tensor| {
            check_blend(running, batch)?;
            let batch = match running.dtype() {
                DType::BF16 | DType::F16 => batch.to_dtype(DType::F32)?,
                _ => batch.clone(),
            };
            batch.contiguous()
        };
        let batch_mean = as_batch(stats.mean, batch_mean)?;
        let batch_var = as_batch(stats.var, batch_var)?;
        return super::running_average_cuda::update_running(
            &stats,
            &batch_mean,
            &batch_var,
            momentum,
            var_scale,
        );
    }
    blend_into(stats.mean, batch_mean, momentum, 1.0)?;
    blend_into(stats.var, batch_var, momentum, var_scale)?;
    let count = stats.count.reshape(1)?;
    count.slice_set(&(&count + 1.0)?, 0, 0)
}

/// The error of `running` and `batch` that cannot be blended.
fn check_blend(running: &Tensor, batch: &Tensor) -> Result<()> {
    if running.elem_count() != batch.elem_count() || !blends(running.dtype(), batch.dtype()) {
        bail!(
            "blend_into: running {:?} {:?} and batch {:?} {:?} differ",
            running.dims(),
            running.dtype(),
            batch.dims(),
            batch.dtype()
        );
    }
    Ok(())
}

/// Blends `batch` into `running` (same length; the same dtype, or f32 for 16-bit `running`) in
/// place.
pub fn blend_into(running: &Tensor, batch: &Tensor, momentum: f64, scale: f64) -> Result<()> {
    check_blend(running, batch)?;
    if uses_kernels_with_half(&[running, batch]) {
        // The kernels read 16-bit running statistics' batch statistics in f32.
        let batch = match running.dtype() {
            DType::BF16 | DType::F16 => batch.to_dtype(DType::F32)?,
            _ => batch.clone(),
        };
        return running.inplace_op2(&batch.contiguous()?, &Blend { momentum, scale });
    }
    let batch = batch.to_dtype(running.dtype())?;
    let value =
        ((running * (1.0 - momentum))? + (batch.reshape(running.shape())? * (momentum * scale))?)?;
    running.slice_set(&value, 0, 0)
}

struct Blend {
    momentum: f64,
    scale: f64,
}

impl Blend {
    fn blended(&self, running: f64, batch: f64) -> f64 {
        (1.0 - self.momentum) * running + self.momentum * self.scale * batch
    }

    fn apply<T: Float>(&self, running: &mut [T], batch: &[T]) {
        for (r, b) in running.iter_mut().zip(batch) {
            *r = T::from_f64(self.blended(r.to_f64(), b.to_f64()));
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
            (CpuStorage::BF16(d), CpuStorage::F32(s)) => {
                for (r, b) in d[dst_r].iter_mut().zip(&s[src_r]) {
                    *r = half::bf16::from_f64(self.blended(r.to_f64(), *b as f64));
                }
            }
            (CpuStorage::F16(d), CpuStorage::F32(s)) => {
                for (r, b) in d[dst_r].iter_mut().zip(&s[src_r]) {
                    *r = half::f16::from_f64(self.blended(r.to_f64(), *b as f64));
                }
            }
            _ => bail!("blend_into: f32 or f64 tensors of one dtype, or 16-bit and f32, expected"),
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
