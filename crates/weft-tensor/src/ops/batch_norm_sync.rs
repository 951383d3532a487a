//! Where a graph-free batch norm takes its statistics from: this rank's batch, or the global
//! batch over every rank (SyncBatchNorm on weft's kernels). Every rank's count, mean and
//! variance are gathered in one collective and combined as Chan et al. combine partial moments
//! (PyTorch's `batch_norm_gather_stats_with_counts`): the global mean, then
//! M2 = Σ n_r (var_r + (mean_r − mean)²), so no sum of squares is subtracted from another. The
//! backward sums the per-channel gradient sums over the ranks once and rescales them so that
//! the input-gradient kernel, which divides by this rank's count, divides by the global one.
//! The small passes between the kernels and the collectives are one launch each
//! (`batch_norm_sync_op`), and every count stays on the device: nothing is read on the host,
//! so the step is captured in a CUDA graph.

use candle_core::{Result, Tensor};

use super::batch_norm_sync_op::{SyncOp, SyncPass};
use crate::CrossRankSum;

/// The statistics a graph-free batch norm normalises with.
#[derive(Clone, Copy)]
pub enum BatchStats<'a> {
    /// This rank's batch.
    Local,
    /// This rank's batch, blended into running statistics by the pass that computes it (see
    /// [`super::RunningUpdate`]); the backward takes it as `Local`.
    LocalUpdating(super::RunningUpdate<'a>),
    /// The global batch of every rank, through a sum over the ranks (SyncBatchNorm).
    Global(&'a dyn CrossRankSum),
}

impl BatchStats<'_> {
    /// The `[mean; var; weight; bias]` table to normalise with, from this rank's (`count`
    /// elements per channel), and the variance's unbiasing factor `N / max(N − 1, 1)` of the
    /// global count N (`None` when local).
    pub(super) fn combine(&self, local: Tensor, count: usize) -> Result<(Tensor, Option<Tensor>)> {
        let BatchStats::Global(sum) = self else {
            return Ok((local, None));
        };
        let channels = local.dim(1)?;
        let pack = SyncPass::Pack {
            first_row: 0,
            count: count as f64,
        };
        let gathered = sum.gather(&local.apply_op1_no_bwd(&SyncOp(pack))?)?;
        let combined = gathered.apply_op2_no_bwd(&local, &SyncOp(SyncPass::Combine))?;
        let table = combined
            .narrow(0, 0, 4 * channels)?
            .reshape((4, channels))?;
        Ok((table, Some(combined.narrow(0, 4 * channels, 1)?)))
    }

    /// The `[mean; var; weight; bias; sum(dy * xhat); sum(dy)]` table the input-gradient
    /// kernel reads, from this rank's (`count` elements per channel): when global, the two
    /// sums are summed over the ranks and scaled by `count / global count`, as the kernel
    /// divides them by `count`.
    pub(super) fn combine_grads(&self, local: &Tensor, count: usize) -> Result<Tensor> {
        let BatchStats::Global(sum) = self else {
            return Ok(local.clone());
        };
        let count = count as f64;
        let pack = SyncPass::Pack {
            first_row: 4,
            count,
        };
        let summed = sum.sum_owned(local.apply_op1_no_bwd(&SyncOp(pack))?)?;
        local.apply_op2_no_bwd(&summed, &SyncOp(SyncPass::Scale { count }))
    }
}
