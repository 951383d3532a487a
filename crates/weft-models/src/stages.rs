//! What the decoders' pipeline stages share: the check that a stage's blocks are a non-empty
//! range of the model's.

use std::ops::Range;

use crate::error::{ModelError, Result};

/// Refuses `blocks` unless they are a non-empty range of the `total` blocks of the model
/// `name`.
pub(crate) fn check_blocks(name: &str, blocks: &Range<usize>, total: usize) -> Result<()> {
    if blocks.is_empty() || blocks.end > total {
        return Err(ModelError::Config(format!(
            "{name}: blocks {blocks:?} are not a non-empty range of its {total} blocks"
        )));
    }
    Ok(())
}
