//! `Cifar10`: the CIFAR-10 binary format (`data_batch_1.bin` … `data_batch_5.bin`,
//! `test_batch.bin`). Each record is 1 label byte followed by 3072 bytes:
//! the 32x32 red plane, then green, then blue, rows top to bottom. Files are
//! memory-mapped: a record's pages are read when a sample needs them.

use std::path::{Path, PathBuf};

use crate::dataset::check_index;
use crate::mapped::SharedBytes;
use crate::{DataError, Dataset, RgbImage, Sample};

/// Side of a CIFAR-10 image.
pub const CIFAR10_IMAGE_SIZE: usize = 32;
const PLANE_BYTES: usize = CIFAR10_IMAGE_SIZE * CIFAR10_IMAGE_SIZE;
/// Bytes per record: label + three colour planes.
pub const CIFAR10_RECORD_BYTES: usize = 1 + 3 * PLANE_BYTES;

/// CIFAR-10 class names, indexed by label.
pub const CIFAR10_CLASSES: [&str; 10] = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
];

/// Which part of CIFAR-10 to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// `data_batch_1.bin` … `data_batch_5.bin` (50 000 images).
    Train,
    /// `test_batch.bin` (10 000 images).
    Test,
}

impl Split {
    /// The file names making up this split, in order.
    pub fn file_names(self) -> Vec<String> {
        match self {
            Split::Train => (1..=5).map(|i| format!("data_batch_{i}.bin")).collect(),
            Split::Test => vec!["test_batch.bin".to_string()],
        }
    }
}

/// CIFAR-10: the records of the split's files, mapped (or, from [`Cifar10::from_bytes`], in
/// memory), each file checked whole when opened.
#[derive(Debug, Clone)]
pub struct Cifar10 {
    /// Each file's records, in the split's order.
    files: Vec<SharedBytes>,
    /// The index of each file's first record, then the total number of records.
    starts: Vec<usize>,
}

impl Cifar10 {
    /// Maps and validates every file of `split` under `root`.
    pub fn open(root: impl AsRef<Path>, split: Split) -> Result<Self, DataError> {
        let mut files = Vec::new();
        for name in split.file_names() {
            let path = root.as_ref().join(name);
            let bytes = SharedBytes::map(&path)?;
            check_records(&path, &bytes)?;
            files.push(bytes);
        }
        Ok(Self::from_files(files))
    }

    /// CIFAR-10 from the bytes of one file (named `origin` in errors), checked as [`Self::open`]
    /// checks files.
    pub fn from_bytes(origin: &Path, bytes: Vec<u8>) -> Result<Self, DataError> {
        check_records(origin, &bytes)?;
        Ok(Self::from_files(vec![SharedBytes::from(bytes)]))
    }

    fn from_files(files: Vec<SharedBytes>) -> Self {
        let mut starts = vec![0];
        for file in &files {
            starts.push(starts[starts.len() - 1] + file.len() / CIFAR10_RECORD_BYTES);
        }
        Self { files, starts }
    }

    /// Record `index` (below `len()`): its label byte and three planes.
    fn record(&self, index: usize) -> &[u8] {
        let file = self.starts.partition_point(|&start| start <= index) - 1;
        let offset = (index - self.starts[file]) * CIFAR10_RECORD_BYTES;
        &self.files[file][offset..][..CIFAR10_RECORD_BYTES]
    }
}

/// `Ok` if `bytes` are whole records with labels 0..=9.
fn check_records(path: &Path, bytes: &[u8]) -> Result<(), DataError> {
    let invalid = |reason: String| DataError::InvalidFile {
        path: PathBuf::from(path),
        reason,
    };
    if bytes.is_empty() || !bytes.len().is_multiple_of(CIFAR10_RECORD_BYTES) {
        return Err(invalid(format!(
            "size {} bytes is not a positive multiple of the {CIFAR10_RECORD_BYTES}-byte record \
             (file truncated or not CIFAR-10 binary)",
            bytes.len()
        )));
    }
    for (record, chunk) in bytes.chunks_exact(CIFAR10_RECORD_BYTES).enumerate() {
        if usize::from(chunk[0]) >= CIFAR10_CLASSES.len() {
            return Err(invalid(format!(
                "record {record} has label {}, expected 0..=9",
                chunk[0]
            )));
        }
    }
    Ok(())
}

impl Dataset for Cifar10 {
    fn len(&self) -> usize {
        self.starts[self.starts.len() - 1]
    }

    fn get(&self, index: usize) -> Result<Sample, DataError> {
        check_index(index, self.len())?;
        let record = self.record(index);
        let (red, rest) = record[1..].split_at(PLANE_BYTES);
        let (green, blue) = rest.split_at(PLANE_BYTES);
        let data = red
            .iter()
            .zip(green)
            .zip(blue)
            .flat_map(|((&r, &g), &b)| [r, g, b])
            .collect();
        let image = RgbImage::new(CIFAR10_IMAGE_SIZE, CIFAR10_IMAGE_SIZE, data)?;
        Ok(Sample {
            image,
            label: u32::from(record[0]),
        })
    }

    fn num_classes(&self) -> usize {
        CIFAR10_CLASSES.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record with `label` whose red/green/blue planes hold `(i + k) % 256` for pixel i.
    fn record(label: u8, k: usize) -> Vec<u8> {
        let mut bytes = vec![label];
        for plane in 0..3 {
            bytes.extend((0..PLANE_BYTES).map(|i| ((i + k + plane * 7) % 256) as u8));
        }
        bytes
    }

    fn write_test_batch(dir: &Path, bytes: &[u8]) -> PathBuf {
        let path = dir.join("test_batch.bin");
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn parses_exact_pixels_and_labels() {
        let dir = tempfile::tempdir().unwrap();
        write_test_batch(dir.path(), &[record(3, 0), record(9, 100)].concat());
        let data = Cifar10::open(dir.path(), Split::Test).unwrap();
        assert_eq!((data.len(), data.num_classes()), (2, 10));
        let first = data.get(0).unwrap();
        assert_eq!(first.label, 3);
        assert_eq!(first.image.pixel(0, 0), [0, 7, 14]);
        // Pixel (x=5, y=2) is plane offset 2*32+5 = 69.
        assert_eq!(first.image.pixel(5, 2), [69, 76, 83]);
        let second = data.get(1).unwrap();
        assert_eq!(second.label, 9);
        let last = [1123 % 256, 1130 % 256, 1137 % 256].map(|v: usize| v as u8);
        assert_eq!(second.image.pixel(31, 31), last);
        assert!(matches!(
            data.get(2),
            Err(DataError::IndexOutOfRange { index: 2, len: 2 })
        ));
    }

    /// The five training files, mapped, read what the files' bytes read in memory (the
    /// reading before mapping), record by record across the files' boundaries.
    #[test]
    fn mapped_files_read_as_their_bytes_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let mut all = Vec::new();
        for (file, records) in [1, 3, 1, 2, 1].into_iter().enumerate() {
            let bytes: Vec<u8> = (0..records)
                .flat_map(|r| record(((file + r) % 10) as u8, 37 * file + r))
                .collect();
            std::fs::write(
                dir.path().join(format!("data_batch_{}.bin", file + 1)),
                &bytes,
            )
            .unwrap();
            all.extend(bytes);
        }
        let mapped = Cifar10::open(dir.path(), Split::Train).unwrap();
        let in_memory = Cifar10::from_bytes(Path::new("all"), all).unwrap();
        assert_eq!((mapped.len(), in_memory.len()), (8, 8));
        for index in 0..8 {
            assert_eq!(mapped.get(index).unwrap(), in_memory.get(index).unwrap());
        }
        assert_eq!(mapped.get(4).unwrap().label, 2);
        assert!(mapped.get(8).is_err());
    }

    #[test]
    fn truncated_file_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = record(1, 0);
        bytes.pop();
        let path = write_test_batch(dir.path(), &bytes);
        let err = Cifar10::open(dir.path(), Split::Test)
            .unwrap_err()
            .to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("3072 bytes"), "{err}");
    }

    #[test]
    fn missing_file_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = Cifar10::open(dir.path(), Split::Train)
            .unwrap_err()
            .to_string();
        assert!(err.contains("data_batch_1.bin"), "{err}");
    }

    #[test]
    fn bad_label_is_an_error_naming_file_and_record() {
        let dir = tempfile::tempdir().unwrap();
        write_test_batch(dir.path(), &[record(0, 0), record(10, 0)].concat());
        let err = Cifar10::open(dir.path(), Split::Test)
            .unwrap_err()
            .to_string();
        assert!(err.contains("test_batch.bin"), "{err}");
        assert!(err.contains("record 1 has label 10"), "{err}");
    }
}
