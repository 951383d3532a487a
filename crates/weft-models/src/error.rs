//! The error type of weft-models.

/// Errors raised while building or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("unknown model `{name}`; expected one of: {known}")]
    UnknownModel { name: String, known: String },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Tensor(#[from] weft_tensor::TensorError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Result alias of weft-models.
pub type Result<T> = std::result::Result<T, ModelError>;
