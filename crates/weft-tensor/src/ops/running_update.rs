//! [`RunningUpdate`]: the running statistics a graph-free training forward blends its batch's
//! into ([`super::BatchStats::LocalUpdating`]). On CUDA the kernel that finishes the batch's
//! `[mean; var; weight; bias]` table does it ([`RunningTarget`], `kernels/batch_norm.cu`'s
//! `table_finalize`), which saves each batch norm the update's own launch (53 a ResNet-50
//! step); elsewhere [`update_running_stats`] runs right after.

use candle_core::{Result, Tensor};

use super::running_average::{update_running_stats, RunningStats};

/// Running statistics and the momentum to blend a training batch's statistics into them with,
/// the variance unbiased by the batch's count (PyTorch's `BatchNorm2d`).
#[derive(Clone, Copy)]
pub struct RunningUpdate<'a> {
    pub stats: RunningStats<'a>,
    pub momentum: f64,
}

/// `N / max(N − 1, 1)`: a batch's biased variance over `count` elements per channel to the
/// unbiased one.
fn unbiasing(count: usize) -> f64 {
    count as f64 / (count as f64 - 1.0).max(1.0)
}

impl RunningUpdate<'_> {
    /// Blends the statistics of `table` (`[mean; biased var; ..]` of a batch of `count`
    /// elements per channel) into the running ones: the update the kernel did not do.
    pub(super) fn apply(&self, table: &Tensor, count: usize) -> Result<()> {
        update_running_stats(
            self.stats,
            &table.get(0)?,
            &table.get(1)?,
            self.momentum,
            unbiasing(count),
        )
    }

    /// The update as the table kernels of data `x` (`count` elements per channel) take it:
    /// running mean and variance of `x`'s dtype, contiguous on its device, and an i64 count;
    /// `None` otherwise (then [`Self::apply`] after the table).
    #[cfg(feature = "cuda")]
    pub(super) fn target(&self, x: &Tensor, count: usize) -> Result<Option<RunningTarget>> {
        use super::cuda_launch::device_address;
        let RunningStats {
            mean,
            var,
            count: batches,
        } = self.stats;
        let fits = |t: &Tensor| {
            t.dtype() == x.dtype() && t.device().same_device(x.device()) && t.is_contiguous()
        };
        if !fits(mean)
            || !fits(var)
            || batches.dtype() != candle_core::DType::I64
            || !batches.device().same_device(x.device())
        {
            return Ok(None);
        }
        Ok(Some(RunningTarget {
            mean: device_address(mean)?,
            var: device_address(var)?,
            count: device_address(batches)?,
            momentum: self.momentum,
            var_scale: unbiasing(count),
        }))
    }
}

/// The device addresses and factors `bn_table_finalize` blends the running statistics with
/// (all zero: no update).
#[cfg(feature = "cuda")]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RunningTarget {
    pub mean: u64,
    pub var: u64,
    pub count: u64,
    pub momentum: f64,
    pub var_scale: f64,
}

#[cfg(feature = "cuda")]
impl RunningTarget {
    /// Pushes the kernel's five trailing arguments.
    pub(crate) fn push<'a>(&'a self, builder: &mut cudarc::driver::LaunchArgs<'a>) {
        use cudarc::driver::PushKernelArg;
        builder
            .arg(&self.mean)
            .arg(&self.var)
            .arg(&self.count)
            .arg(&self.momentum)
            .arg(&self.var_scale);
    }
}
