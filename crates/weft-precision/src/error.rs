//! The error type of weft-precision.

/// Errors of the precision layer; each names the setting or value concerned.
#[derive(Debug, thiserror::Error)]
pub enum PrecisionError {
    #[error("unknown precision `{name}`; expected one of {known}")]
    UnknownPreset { name: String, known: String },
    #[error("loss scaler: {field} = {value} is invalid: must be {requirement}")]
    InvalidScaler {
        field: &'static str,
        value: String,
        requirement: &'static str,
    },
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}
