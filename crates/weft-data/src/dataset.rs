//! The `Dataset` trait shared by all datasets, and the `Sample` it yields.

use crate::{DataError, RgbImage};

/// One labelled image as stored by a dataset (before any transform).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub image: RgbImage,
    pub label: u32,
}

/// A random-access collection of labelled images.
///
/// Implementations must be `Send + Sync` so loader worker threads can share
/// one instance through `Arc<dyn Dataset>`, and `get` must be a pure function
/// of the index so results do not depend on which thread asks.
pub trait Dataset: Send + Sync {
    /// Number of samples.
    fn len(&self) -> usize;

    /// The sample at `index` (`0..len()`); out-of-range indices are an error.
    fn get(&self, index: usize) -> Result<Sample, DataError>;

    /// Number of classes; every label is `< num_classes()`.
    fn num_classes(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Summarises a dataset as its length and class count.
impl std::fmt::Debug for dyn Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Dataset(len {}, {} classes)",
            self.len(),
            self.num_classes()
        )
    }
}

/// Returns `IndexOutOfRange` unless `index < len`.
pub(crate) fn check_index(index: usize, len: usize) -> Result<(), DataError> {
    if index < len {
        Ok(())
    } else {
        Err(DataError::IndexOutOfRange { index, len })
    }
}
