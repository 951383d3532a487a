//! Making replicas identical: a cheap one-time check that every rank built the same model
//! (names, shapes, dtypes), and broadcasting parameters or buffers from one rank.

use candle_core::{DType, Tensor};
use weft_collectives::{Buffer, Communicator, TensorCollectives};
use weft_tensor::{EntryId, ParamStore};

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

/// Overwrites the given entries on every rank with `root`'s values (one broadcast per dtype).
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
        let group: Vec<EntryId> = ids
            .iter()
            .copied()
            .filter(|&id| store.entries()[id].var.dtype() == dtype)
            .collect();
        let flat: Vec<Tensor> = group
            .iter()
            .map(|&id| store.entries()[id].tensor().flatten_all())
            .collect::<candle_core::Result<_>>()?;
        let joined = Tensor::cat(&flat, 0)?;
        let received = comm.broadcast_tensor(&joined, root)?.wait()?;
        let mut offset = 0;
        for &id in &group {
            let var = &store.entries()[id].var;
            let n = var.elem_count();
            var.set(&received.narrow(0, offset, n)?.reshape(var.shape())?)?;
            offset += n;
        }
    }
    Ok(())
}
