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
    /// An image's header gives dimensions over the [`crate::ImageLimits`]: refused before its
    /// pixels are decoded.
    #[error("{path}: image {width}x{height} refused before decoding: {reason}")]
    ImageTooLarge {
        path: PathBuf,
        width: u32,
        height: u32,
        reason: String,
    },
    /// A validation folder's classes are not the training folder's (labels follow the sorted
    /// class list, so any difference would shift every later label).
    #[error(
        "{val}: validation classes differ from the training classes of {train}: missing {}, extra {}",
        name_list(.missing),
        name_list(.extra)
    )]
    ClassMismatch {
        train: PathBuf,
        val: PathBuf,
        /// Training classes without a validation folder.
        missing: Vec<String>,
        /// Validation folders that are no training class.
        extra: Vec<String>,
    },
    /// Under [`crate::BadSamplePolicy::Skip`], a bad sample for which no sample of the
    /// dataset could stand in: every one of them is bad.
    #[error(
        "sample {index} is bad and none of the dataset's {len} samples can replace it: {source}"
    )]
    NoGoodSample {
        index: usize,
        len: usize,
        #[source]
        source: Box<DataError>,
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

impl DataError {
    /// Whether the error is about one sample's contents (an undecodable image, one over the
    /// image limits) rather than the disk, the dataset's layout or the configuration: what
    /// [`crate::BadSamplePolicy::Skip`] replaces instead of ending the run.
    pub fn is_bad_sample(&self) -> bool {
        matches!(self, Self::Decode { .. } | Self::ImageTooLarge { .. })
    }
}

/// Up to ten names in brackets, then how many more (keeps a long difference on one line).
fn name_list(names: &[String]) -> String {
    const SHOWN: usize = 10;
    let shown: Vec<&str> = names.iter().take(SHOWN).map(String::as_str).collect();
    match names.len().saturating_sub(SHOWN) {
        0 => format!("[{}]", shown.join(", ")),
        more => format!("[{}, and {more} more]", shown.join(", ")),
    }
}
