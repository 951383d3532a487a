//! `SharedBytes`: read-only bytes shared between threads, either a file memory-mapped (its
//! pages read on demand and kept by the page cache, nothing copied onto the heap) or a buffer
//! already in memory.

use std::fs::File;
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use crate::DataError;

/// A file's bytes, mapped, or bytes handed over in a `Vec`; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) enum SharedBytes {
    Mapped(Arc<Mmap>),
    Owned(Arc<Vec<u8>>),
}

impl SharedBytes {
    /// Maps the file at `path` read-only.
    pub fn map(path: &Path) -> Result<Self, DataError> {
        let io_error = |source| DataError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io_error)?;
        // SAFETY: the map is read-only and private; its bytes change only if another process
        // writes the file while it is mapped, which a data set being read is not. (A file
        // truncated under the map ends the process with SIGBUS at the next read, the known
        // limit of reading files by mapping them.)
        let map = unsafe { Mmap::map(&file) }.map_err(io_error)?;
        Ok(Self::Mapped(Arc::new(map)))
    }
}

impl From<Vec<u8>> for SharedBytes {
    fn from(bytes: Vec<u8>) -> Self {
        Self::Owned(Arc::new(bytes))
    }
}

impl Deref for SharedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Mapped(map) => map,
            Self::Owned(bytes) => bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_file_reads_as_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        let bytes: Vec<u8> = (0..=255).cycle().take(10_000).collect();
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(&*SharedBytes::map(&path).unwrap(), &bytes[..]);
        std::fs::write(&path, b"").unwrap();
        assert!(SharedBytes::map(&path).unwrap().is_empty());
        let missing = dir.path().join("missing.bin");
        let err = SharedBytes::map(&missing).unwrap_err().to_string();
        assert!(err.contains("missing.bin"), "{err}");
        assert_eq!(&*SharedBytes::from(vec![1, 2]), &[1, 2]);
    }
}
