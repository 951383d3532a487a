//! Making replicas identical: a cheap one-time check that every rank built the same model
//! (names, shapes, dtypes), and broadcasting parameters or buffers from one rank.

use candle_core::{DType, Tensor};
use weft_collectives::{Buffer, Communicator};
use weft_tensor::ops::copy_tensors;
use weft_tensor::{EntryId, ParamStore};

use super::BufferBroadcast;
use crate::collectives::{broadcast_ordered, native_for, TensorCollectives};
use crate::error::{ParallelError, Result};

/// FNV-1a over every entry's name, shape and dtype, in order.
fn fingerprint(store: &ParamStore) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for e in store.entries() {
        let text = format!("{}:{:?}:{:?};", e.name, e.var.dims(), e.var.dtype());
        for byte in text.bytes() {
            hash = (hash ^ byte as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash as i64
}

/// Fails on every rank, naming the first rank whose model differs from rank 0's.
pub fn check_same_model(store: &ParamStore, comm: &dyn Communicator) -> Result<()> {
    let mine = vec![fingerprint(store), store.len() as i64];
    let all: Vec<i64> = comm.all_gather(Buffer::from(mine)).wait_vec()?;
    let reference = &all[0..2];
    for (rank, theirs) in all.chunks(2).enumerate().skip(1) {
        if theirs != reference {
            return Err(ParallelError::ModelMismatch {
                rank,
                detail: format!(
                    "it has {} entries (rank 0: {}) and different parameter names, shapes or dtypes",
                    theirs[1], reference[1]
                ),
            });
        }
    }
    Ok(())
}

/// Overwrites every rank's buffers (BatchNorm running statistics) with rank 0's, as PyTorch's
/// DDP does before each forward with `broadcast_buffers`.
pub fn broadcast_buffers(store: &ParamStore, comm: &dyn Communicator) -> Result<()> {
    broadcast_entries(store, &store.buffer_ids(), comm, 0)
}

impl BufferBroadcast {
    /// Before a training forward: rank 0's buffers to every rank if the setting says so.
    pub(crate) fn before_forward(self, store: &ParamStore, comm: &dyn Communicator) -> Result<()> {
        match self {
            BufferBroadcast::EveryForward => broadcast_buffers(store, comm),
            BufferBroadcast::BeforeReads | BufferBroadcast::Off => Ok(()),
        }
    }

    /// Before the buffers are read ([`crate::Strategy::sync_buffers`]): rank 0's buffers to
    /// every rank unless the broadcast is off.
    pub(crate) fn before_read(self, store: &ParamStore, comm: &dyn Communicator) -> Result<()> {
        match self {
            BufferBroadcast::Off => Ok(()),
            BufferBroadcast::EveryForward | BufferBroadcast::BeforeReads => {
                broadcast_buffers(store, comm)
            }
        }
    }
}

/// Overwrites the given entries on every rank with `root`'s values: per dtype, the entries are
/// gathered into one flat tensor, broadcast, and scattered back (a few launches on a GPU
/// whatever the number of entries, see [`copy_tensors`]).
pub fn broadcast_entries(
    store: &ParamStore,
    ids: &[EntryId],
    comm: &dyn Communicator,
    root: usize,
) -> Result<()> {
    let mut dtypes: Vec<DType> = ids
        .iter()
        .map(|&id| store.entries()[id].var.dtype())
        .collect();
    dtypes.sort_by_key(|d| d.as_str());
    dtypes.dedup();
    for dtype in dtypes {
        let group: Vec<&Tensor> = ids
            .iter()
            .map(|&id| store.entries()[id].tensor())
            .filter(|t| t.dtype() == dtype)
            .collect();
        let total: usize = group.iter().map(|t| t.elem_count()).sum();
        let joined = Tensor::zeros(total, dtype, store.device())?;
        let views = views_of(&joined, &group)?;
        copy_tensors(&group.iter().copied().zip(&views).collect::<Vec<_>>())?;
        let received = match native_for(comm, joined.device()) {
            // In place, ordered on the device (see DistributedDataParallel).
            Some(device) => {
                broadcast_ordered(device, &joined, root)?.join()?;
                joined
            }
            None => comm.broadcast_tensor(&joined, root)?.wait()?,
        };
        let views = views_of(&received, &group)?;
        copy_tensors(&views.iter().zip(group.iter().copied()).collect::<Vec<_>>())?;
    }
    Ok(())
}

/// Consecutive views of the flat `joined`, one per tensor of `group`, in order.
fn views_of(joined: &Tensor, group: &[&Tensor]) -> Result<Vec<Tensor>> {
    let mut offset = 0;
    let mut views = Vec::with_capacity(group.len());
    for t in group {
        views.push(joined.narrow(0, offset, t.elem_count())?);
        offset += t.elem_count();
    }
    Ok(views)
}
