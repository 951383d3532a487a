//! Megatron-style tensor parallelism: layers whose weights are split across the ranks of a
//! tensor-parallel group, joined by conjugate collectives.
//!
//! - [`mappings`]: f / g, the gather / scatter pair and the all-gather / reduce-scatter pair
//!   (sequence parallelism), each an op with its backward, and the
//!   [`TensorParallelGroup`] they run over (a sub-communicator from `Communicator::split`).
//! - [`ColumnParallelLinear`] / [`RowParallelLinear`]: split by output / input features.
//! - [`VocabParallelEmbedding`] and [`vocab_parallel_cross_entropy`]: the token table split by
//!   rows, and the loss over logits split the same way.
//! - [`TensorParallel`]: the strategy of a rank of the group, agreeing with the others on the
//!   gradient norm and on skipped steps.
//!
//! The layers are built from full-size initial values and keep only their rank's slice; a
//! model applies them in its trainer's `parallelize` step (weft-train), staying free of
//! parallelism itself.

mod cross_entropy;
mod embedding;
mod layers;
pub mod mappings;
mod strategy;

pub use cross_entropy::{
    vocab_parallel_cross_entropy, vocab_parallel_cross_entropy_and_grad, VocabParallelNextToken,
};
pub use embedding::VocabParallelEmbedding;
pub use layers::{column_slice, row_slice, ColumnParallelLinear, RowParallelLinear};
pub use mappings::{
    all_gather_first, copy_to_region, gather_from_region, reduce_from_region, reduce_scatter_first,
    scatter_to_region, TensorParallelGroup,
};
pub use strategy::TensorParallel;

#[cfg(test)]
mod tests;
