//! ZeRO (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
//! Models"): data parallelism without the redundant optimizer state. Every rank still holds
//! the whole model and trains on its slice of the batch, but the flat buffers are cut into one
//! shard per rank ([`ShardLayout`]) and each rank keeps the optimizer state of its shard only,
//! steps it, and all-gathers the updated parameters ([`ZeroRedundancy`]).
//!
//! - [`naive_zero`]: the reference — every gradient all-reduced after backward, one blocking
//!   call each, then the sharded step and the all-gather. The oracle of the tests.
//! - [`zero_stage1`]: the gradients averaged by DDP's buckets, overlapped with backward.
//! - [`zero_stage2`]: the gradients sharded too ([`ShardedGradients`]): each bucket staged
//!   as backward fills it, its parts averaged into the ranks that own them (a reduce per owner,
//!   DeepSpeed's `average_tensor`: half the traffic of an all-reduce), overlapped with
//!   backward, and dropped; each rank keeps its shard of the gradients only. Under NCCL the
//!   reduces run in place, ordered on the device; through the host on the CPU.
//! - [`zero_stage3`]: stage 2's gradient reduce, and the parameters sharded as well: each
//!   block's gathered from their owners before its forward and its backward, the next block's
//!   gather in flight meanwhile, released afterwards ([`ZeroStage3`]).
//!
//! - [`checkpoint`]: sharded checkpoints (a file per rank and a [`manifest`]), read back by any
//!   number of ranks; [`full_state`]: exported to and imported from a full state dict;
//!   [`whole_state`]: read whole into memory and loaded into a trainer cut another way.
//!
//! All of them give the parameters of one process training on the whole batch, up to the
//! order of the gradient sums (tests/zero_equivalence.rs).

mod block_gather;
pub mod checkpoint;
pub mod full_state;
mod gather;
pub mod manifest;
pub mod shard_part;
mod sharded;
mod sharded_gradients;
mod shards;
mod stage3;
pub mod whole_state;

use std::sync::Arc;

use candle_core::Tensor;
use weft_collectives::Communicator;
use weft_tensor::{BlockModel, FlatBuffer};

use crate::ddp::{DdpConfig, DistributedDataParallel, NaiveDataParallel};
use crate::error::Result;

pub use sharded::ZeroRedundancy;
pub use sharded_gradients::{ShardedGradients, IN_FLIGHT};
pub use shards::ShardLayout;
pub use stage3::ZeroStage3;

/// The reference ZeRO: naive data parallelism's gradient all-reduce, the optimizer sharded.
pub fn naive_zero(
    model: &BlockModel,
    grads: &FlatBuffer,
    comm: Arc<dyn Communicator>,
    find_unused_parameters: bool,
) -> Result<ZeroRedundancy> {
    let sync = NaiveDataParallel::new(model, comm.clone(), find_unused_parameters)?;
    Ok(ZeroRedundancy::new(
        "naive-zero",
        Box::new(sync),
        grads,
        comm,
    ))
}

/// ZeRO stage 1: optimizer states sharded; gradients all-reduced in DDP's buckets.
pub fn zero_stage1(
    model: &BlockModel,
    grads: &FlatBuffer,
    comm: Arc<dyn Communicator>,
    config: DdpConfig,
) -> Result<ZeroRedundancy> {
    let sync = DistributedDataParallel::new(model, grads, comm.clone(), config)?;
    Ok(ZeroRedundancy::new("zero1", Box::new(sync), grads, comm))
}

/// ZeRO stage 2: as stage 1, but each bucket is reduced into the ranks that own its parts.
pub fn zero_stage2(
    model: &BlockModel,
    grads: &FlatBuffer,
    comm: Arc<dyn Communicator>,
    config: DdpConfig,
) -> Result<ZeroRedundancy> {
    let sync = ShardedGradients::new(model, grads, comm.clone(), config)?;
    Ok(ZeroRedundancy::new("zero2", Box::new(sync), grads, comm))
}

/// ZeRO stage 3: as stage 2, and the parameters sharded too — each block's gathered from
/// their owners around its forward and backward ([`ZeroStage3`]).
pub fn zero_stage3(
    model: &BlockModel,
    grads: &FlatBuffer,
    comm: Arc<dyn Communicator>,
    config: DdpConfig,
) -> Result<ZeroStage3> {
    zero_stage3_from_shard(model, grads, comm, config, None)
}

/// ZeRO stage 3 over a model built by a sharded initialisation
/// ([`weft_tensor::sharded_init::ShardedInit`]), whose parameters no rank holds whole: `shard`
/// is this rank's cut of them (`None`: read from the model, whole on every rank).
pub fn zero_stage3_from_shard(
    model: &BlockModel,
    grads: &FlatBuffer,
    comm: Arc<dyn Communicator>,
    config: DdpConfig,
    shard: Option<Tensor>,
) -> Result<ZeroStage3> {
    let sync = ShardedGradients::new(model, grads, comm.clone(), config)?;
    ZeroStage3::new(Box::new(sync), (model, grads), comm, shard)
}
