//! The all-gather that ends a ZeRO step: every rank reads its updated shard of the parameters
//! from the model (in the model's dtype), pads it to the common shard length, and after one
//! all-gather writes the other ranks' shards into its own model, so every replica is whole
//! and identical again.

use candle_core::Tensor;
use weft_collectives::Communicator;
use weft_tensor::{FlatLayout, ParamStore};

use super::ShardLayout;
use crate::collectives::TensorCollectives;
use crate::error::Result;

/// Makes every rank's parameters whole from the ranks' updated shards.
pub(crate) fn all_gather_parameters(
    comm: &dyn Communicator,
    layout: &FlatLayout,
    shards: &ShardLayout,
    store: &ParamStore,
) -> Result<()> {
    let rank = comm.rank();
    let own = shards.range(rank);
    let dtype = store.dtype();
    let mine = layout.read_range(store, own.clone(), dtype)?;
    let padding = shards.shard_len() - own.len();
    let padded = match padding {
        0 => mine,
        _ => Tensor::cat(&[mine, Tensor::zeros(padding, dtype, store.device())?], 0)?,
    };
    let gathered = comm.all_gather_tensor(&padded)?.wait()?;
    for other in (0..shards.world_size()).filter(|&r| r != rank) {
        let range = shards.range(other);
        let values = gathered.narrow(0, other * shards.shard_len(), range.len())?;
        layout.write_range(store, range.start, &values)?;
    }
    Ok(())
}
