//! The error type of weft-tensor: every failure names the parameter, key or file it concerns.

use std::path::PathBuf;

/// Errors raised by the parameter store, flat buffers and block-wise autograd.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    #[error("parameter `{name}` is registered twice")]
    DuplicateName { name: String },
    #[error("no parameter or buffer named `{name}`")]
    UnknownName { name: String },
    #[error("checkpoint {file}: missing key `{key}`")]
    MissingKey { file: PathBuf, key: String },
    #[error(
        "checkpoint {file}: unexpected key `{key}` (the model has no such parameter or buffer)"
    )]
    UnexpectedKey { file: PathBuf, key: String },
    #[error("checkpoint {file}: key `{key}` has shape {found:?}, the model expects {expected:?}")]
    ShapeMismatch {
        file: PathBuf,
        key: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("checkpoint {file}: key `{key}` has dtype {found:?}, the model expects {expected:?}")]
    DTypeMismatch {
        file: PathBuf,
        key: String,
        expected: candle_core::DType,
        found: candle_core::DType,
    },
    #[error("{file}: {source}")]
    Io {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: cannot read safetensors: {source}")]
    Safetensors {
        file: PathBuf,
        #[source]
        source: candle_core::Error,
    },
    #[error("{file}: not a whole safetensors file: {reason}")]
    DamagedFile { file: PathBuf, reason: String },
    #[error("flat buffer: {0}")]
    Flat(String),
    #[error("block `{block}`: {message}")]
    Block { block: String, message: String },
    #[error("CUDA runtime: {0}")]
    Cuda(String),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Result alias used throughout weft-tensor.
pub type Result<T> = std::result::Result<T, TensorError>;
