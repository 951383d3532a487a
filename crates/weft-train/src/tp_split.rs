//! How the entries of a tensor-parallel model are cut over the ranks of its group ([`Split`],
//! recorded by the parts' factory as it registers them), a rank's part of a whole value, and the
//! whole values joined again from every rank's parts (gathered over the group for export, or
//! read from a checkpoint's slices).

use anyhow::{bail, Result};
use candle_core::Tensor;
use weft_parallel::tensor::{column_slice, row_slice, TensorParallelGroup};
use weft_parallel::TensorCollectives;
use weft_tensor::{EntryId, ParamStore};

/// How a store entry is split over the tensor-parallel group.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// Cut along the last dimension, in `groups` column groups cut separately.
    Columns { groups: usize },
    /// Cut along the first dimension.
    Rows,
    /// Cut along the first dimension, whose rows form groups of these sizes (a Phi-3's fused
    /// q | k | v with fewer key/value heads), each group cut separately.
    RowGroups(Vec<usize>),
}

/// Entry `id`'s part of its `full` value on rank `rank` of `size`, as `splits` cut it.
pub fn slice_of(
    splits: &[(EntryId, Split)],
    id: EntryId,
    full: &Tensor,
    rank: usize,
    size: usize,
) -> weft_parallel::Result<Tensor> {
    match splits.iter().find(|(e, _)| *e == id).map(|(_, s)| s) {
        None => Ok(full.clone()),
        Some(split) => split.slice(full, rank, size),
    }
}

impl Split {
    /// Rank `rank` of `size`'s part of `full`.
    pub fn slice(&self, full: &Tensor, rank: usize, size: usize) -> weft_parallel::Result<Tensor> {
        match self {
            Split::Rows => row_slice(full, rank, size),
            Split::Columns { groups } => column_slice(full, *groups, rank, size),
            Split::RowGroups(groups) => row_groups_slice(full, groups, rank, size),
        }
    }

    /// The whole tensor from every rank's part side by side (rank 0's first) along the
    /// dimension the split cuts.
    pub fn join(&self, side_by_side: &Tensor, ranks: usize) -> Result<Tensor> {
        match self {
            Split::Rows => Ok(side_by_side.clone()),
            Split::Columns { groups } => regroup_columns(side_by_side, *groups, ranks),
            Split::RowGroups(groups) => regroup(side_by_side, 0, groups, ranks),
        }
    }

    /// The dimension the split cuts in a tensor of `rank` dimensions.
    pub fn dim(&self, rank: usize) -> usize {
        match self {
            Split::Columns { .. } => rank.saturating_sub(1),
            Split::Rows | Split::RowGroups(_) => 0,
        }
    }
}

/// Rank `rank` of `size`'s rows of `full`, whose rows form groups of `groups` rows each cut
/// into `size` equal blocks: the rank's block of each group, in group order.
fn row_groups_slice(
    full: &Tensor,
    groups: &[usize],
    rank: usize,
    size: usize,
) -> weft_parallel::Result<Tensor> {
    let rows = full.dim(0)?;
    if groups.iter().sum::<usize>() != rows || groups.iter().any(|g| !g.is_multiple_of(size)) {
        return Err(weft_parallel::ParallelError::Config(format!(
            "{rows} rows do not cut into groups of {groups:?} rows over {size} ranks"
        )));
    }
    let mut parts = Vec::with_capacity(groups.len());
    let mut start = 0;
    for &group in groups {
        parts.push(full.narrow(0, start + rank * group / size, group / size)?);
        start += group;
    }
    Ok(Tensor::cat(&parts, 0)?.contiguous()?)
}

/// The whole model's state from every rank's slices (an all-gather per split entry), as a
/// store with the whole model's names, shapes and order.
pub fn gather_full_state(
    store: &ParamStore,
    splits: &[(EntryId, Split)],
    group: &TensorParallelGroup,
) -> Result<ParamStore> {
    let mut full = ParamStore::new(store.device(), store.dtype());
    for (id, entry) in store.entries().iter().enumerate() {
        let value = entry.tensor();
        let whole = match splits.iter().find(|(e, _)| *e == id).map(|(_, s)| s) {
            None => value.clone(),
            Some(split @ Split::Columns { .. }) => {
                split.join(&group.all_gather_last(value)?, group.size())?
            }
            Some(split) => {
                let side_by_side = group.comm().all_gather_tensor(value)?.wait()?;
                split.join(&side_by_side, group.size())?
            }
        };
        full.register(&entry.name, entry.kind, whole)?;
    }
    Ok(full)
}

/// Columns gathered rank by rank (`r0: g0 g1 … | r1: g0 g1 …`) put back group by group
/// (`g0: r0 r1 … | g1: …`), the groups of equal width.
pub fn regroup_columns(gathered: &Tensor, groups: usize, ranks: usize) -> Result<Tensor> {
    let dim = gathered.rank().saturating_sub(1);
    let width = gathered.dim(dim)?;
    if groups == 0 || !width.is_multiple_of(groups) {
        bail!("{width} columns do not cut into {groups} column groups");
    }
    regroup(gathered, dim, &vec![width / groups; groups], ranks)
}

/// Parts gathered rank by rank along `dim` (`r0: g0 g1 … | r1: g0 g1 …`) put back group by
/// group (`g0: r0 r1 … | g1: …`), the whole groups `groups` long.
fn regroup(gathered: &Tensor, dim: usize, groups: &[usize], ranks: usize) -> Result<Tensor> {
    let width = gathered.dim(dim)?;
    if ranks == 0
        || groups.iter().sum::<usize>() != width
        || groups.iter().any(|g| !g.is_multiple_of(ranks))
    {
        bail!("{width} entries do not cut into groups of {groups:?} over {ranks} ranks");
    }
    let per_rank = width / ranks;
    let mut pieces = Vec::with_capacity(groups.len() * ranks);
    let mut offset = 0;
    for &group in groups {
        for r in 0..ranks {
            pieces.push(gathered.narrow(dim, r * per_rank + offset, group / ranks)?);
        }
        offset += group / ranks;
    }
    Ok(Tensor::cat(&pieces, dim)?)
}
