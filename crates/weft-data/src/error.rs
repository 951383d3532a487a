//! The single error type of weft-data: every failure names the file, index,
//! field or transform involved and says what is wrong.

use std::path::PathBuf;

/// Everything that can go wrong while opening, reading, transforming or
/// batching data.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// An operating-system error while reading `path`.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file exists but its contents are not what the format requires.
    #[error("{path}: {reason}")]
    InvalidFile { path: PathBuf, reason: String },
    /// An image file could not be decoded.
    #[error("cannot decode image {path}: {source}")]
    Decode {
        path: PathBuf,
        #[source]
        source: image::ImageError,
    },
    /// A dataset was asked for an index it does not have.
    #[error("index {index} is out of range for a dataset of {len} samples")]
    IndexOutOfRange { index: usize, len: usize },
    /// A configuration value (of a dataset, sampler, loader or image) is invalid.
    #[error("invalid {field}: {reason}")]
    InvalidConfig { field: &'static str, reason: String },
    /// A transform cannot be applied to the image it was given.
    #[error("{transform}: {reason}")]
    Transform {
        transform: &'static str,
        reason: String,
    },
    /// Samples of one batch do not have the same shape.
    #[error("batch {batch}: sample at dataset index {index} has shape {found:?}, expected {expected:?} (add a crop or resize to the pipeline)")]
    ShapeMismatch {
        batch: usize,
        index: usize,
        expected: [usize; 3],
        found: [usize; 3],
    },
    /// The operating system refused to start a loader worker thread.
    #[error("cannot spawn data loader worker {worker}: {source}")]
    SpawnWorker {
        worker: usize,
        #[source]
        source: std::io::Error,
    },
    /// A loader worker thread panicked while building a batch.
    #[error("data loader worker panicked while building batch {batch}: {message}")]
    WorkerPanicked { batch: usize, message: String },
    /// All loader workers exited before delivering a batch.
    #[error("data loader workers stopped before delivering batch {batch}")]
    WorkersGone { batch: usize },
    /// Converting a batch into Candle tensors failed.
    #[error("converting batch to tensors: {0}")]
    Tensor(#[from] candle_core::Error),
}
