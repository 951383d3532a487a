//! What every bucketed gradient sync (DDP, ZeRO's sharded gradients) shares: the replicas made
//! identical before the first step, and the watched fence that ends a step whose operations
//! are ordered on the device.

use weft_collectives::{Communicator, DeviceCollectives, Work};
use weft_tensor::{residency, BlockModel, EntryId, FlatBuffer};

use super::{broadcast_entries, check_same_model, BucketPlan, DdpConfig};
use crate::error::{ParallelError, Result};

/// Waits until the device has finished the operations ordered on it (`native`: the
/// communicator's device collectives, when the gradients are on their device), watched for
/// dead peers and timeouts; nothing to wait for otherwise.
pub(crate) fn fence(native: Option<&dyn DeviceCollectives>) -> Result<()> {
    if let Some(fence) = fence_later(native)? {
        fence.wait()?;
    }
    Ok(())
}

/// The end of the operations ordered on the device so far, to wait for later ([`fence`]'s
/// wait); `None` when they are not ordered on the device.
pub(crate) fn fence_later(native: Option<&dyn DeviceCollectives>) -> Result<Option<Work<()>>> {
    Ok(native.map(|device| device.fence()).transpose()?)
}

/// What every bucketed gradient sync does first: checks its bucket caps and that every rank
/// has the same model, broadcasts rank 0's parameters and buffers, and plans the buckets over
/// `grads`' layout. Parameters released by a sharded initialisation
/// ([`weft_tensor::sharded_init`]) are not broadcast: every rank built them from the same
/// seed, and each keeps its own shard.
pub(crate) fn prepare_replicas(
    model: &BlockModel,
    grads: &FlatBuffer,
    comm: &dyn Communicator,
    config: &DdpConfig,
) -> Result<BucketPlan> {
    if !(config.bucket_cap_mb > 0.0
        && config.first_bucket_cap_mb > 0.0
        && config.last_bucket_cap_mb >= 0.0)
    {
        return Err(ParallelError::Config(format!(
            "bucket caps must be positive (bucket_cap_mb {}, first_bucket_cap_mb {}; \
             last_bucket_cap_mb {} positive or 0)",
            config.bucket_cap_mb, config.first_bucket_cap_mb, config.last_bucket_cap_mb
        )));
    }
    let store = model.store();
    check_same_model(store, comm)?;
    let whole: Vec<EntryId> = (0..store.len())
        .filter(|&id| residency::is_resident(store.entries()[id].tensor()))
        .collect();
    broadcast_entries(store, &whole, comm, 0)?;
    Ok(BucketPlan::new(
        grads.layout(),
        grads.dtype().size_in_bytes(),
        config.bucket_caps(),
    ))
}
