//! The error type of weft-parallel.

use weft_collectives::CommError;
use weft_tensor::TensorError;

/// Errors of the parallel strategies; each names the rank, parameter or bucket concerned.
#[derive(Debug, thiserror::Error)]
pub enum ParallelError {
    #[error("rank {rank} has a different model than rank 0: {detail}")]
    ModelMismatch { rank: usize, detail: String },
    #[error("parameter `{name}` received no gradient in this step (it took no part in the loss; set find_unused_parameters to reduce it as zero)")]
    UnusedParameter { name: String },
    #[error("parameter `{name}` was reported ready twice in one backward (a tied parameter must be declared shared by the blocks that use it)")]
    ReadyTwice { name: String },
    #[error("parameters never marked ready before the optimizer step: {names:?}")]
    GradientsNotReady { names: Vec<String> },
    #[error("CUDA graph: {0}")]
    CudaGraph(String),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error(transparent)]
    Comm(#[from] CommError),
    #[error(transparent)]
    Tensor(#[from] TensorError),
    #[error("optimizer: {0}")]
    Optim(#[from] weft_optim::OptimError),
    #[error("precision: {0}")]
    Precision(#[from] weft_precision::PrecisionError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Result alias of weft-parallel.
pub type Result<T> = std::result::Result<T, ParallelError>;
