//! What a loader does with a bad sample: one whose data is broken (an undecodable image) or
//! refused (over the [`crate::ImageLimits`]), as [`DataError::is_bad_sample`] tells.
//!
//! By default ([`BadSamplePolicy::Fail`]) the sample's error is its batch's, and the run ends
//! naming the file. Under [`BadSamplePolicy::Skip`] the sample is *replaced*, not dropped: the
//! next good sample of the dataset (index + 1, + 2, …, wrapping at the end) takes its place,
//! augmented with the bad sample's own randomness (`augmentation_rng(seed, epoch, index)`), and
//! the batch records it in [`Batch::skipped`](crate::Batch::skipped).
//!
//! Replacing keeps every batch at its size, which a CUDA graph's fixed input shapes and the
//! equal per-rank batches of data parallelism need (dropping would leave a rank with a short
//! batch, and its gradient weighted differently from the others'). The replacement depends on
//! the dataset alone — not on the rank, its shard, the workers' timing or where a resumed run
//! starts — so every run over the same files makes the same batches, and no rank's choice of
//! samples changes any other rank's. In an `ImageFolder` the next index is almost always a file
//! of the same class, so the class balance barely moves. A bad sample is counted once for each
//! time a rank's epoch visits it; [`crate::DataLoader::skipped_samples`] is the running count.

use crate::{DataError, Dataset, Sample};

/// Whether a bad sample ends the run or is replaced and counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BadSamplePolicy {
    /// The batch holding a bad sample is the sample's error (the run ends, naming its file).
    #[default]
    Fail,
    /// A bad sample is replaced by the next good one of the dataset and recorded in its batch.
    Skip,
}

/// A bad sample replaced in a batch under [`BadSamplePolicy::Skip`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedSample {
    /// The bad sample's dataset index.
    pub index: usize,
    /// The dataset index of the sample in its place.
    pub replacement: usize,
    /// Why it was bad: its error's one line (naming the file).
    pub reason: String,
}

/// Sample `index` of `dataset`; under `Skip`, a bad one is replaced by the next good sample
/// (scanning the whole dataset at most once), and the replacement is returned with it.
pub(crate) fn load_sample(
    dataset: &dyn Dataset,
    index: usize,
    policy: BadSamplePolicy,
) -> Result<(Sample, Option<SkippedSample>), DataError> {
    let error = match dataset.get(index) {
        Ok(sample) => return Ok((sample, None)),
        Err(error) if policy == BadSamplePolicy::Skip && error.is_bad_sample() => error,
        Err(error) => return Err(error),
    };
    let len = dataset.len();
    for step in 1..len {
        let replacement = (index + step) % len;
        match dataset.get(replacement) {
            Ok(sample) => {
                let skipped = SkippedSample {
                    index,
                    replacement,
                    reason: error.to_string(),
                };
                return Ok((sample, Some(skipped)));
            }
            Err(other) if other.is_bad_sample() => continue,
            Err(other) => return Err(other),
        }
    }
    Err(DataError::NoGoodSample {
        index,
        len,
        source: Box::new(error),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::test_images::{image_tree, write_png};
    use crate::{Batch, CenterCrop, DataLoader, ImageFolder, LoaderConfig, Pipeline};

    /// Five 2x2 images in classes a (0, 1, 2) and b (3, 4), the one at `oversized` written as
    /// a 1 x 100000 PNG and the one at `corrupt` as bytes no decoder reads.
    fn folder_with_bad_files(oversized: usize, corrupt: usize) -> (tempfile::TempDir, ImageFolder) {
        let files = [
            ("a", "0.png"),
            ("a", "1.png"),
            ("a", "2.png"),
            ("b", "3.png"),
            ("b", "4.png"),
        ];
        let dir = image_tree(&files);
        let path = |i: usize| dir.path().join(files[i].0).join(files[i].1);
        write_png(&path(oversized), 1, 100_000, [0; 3]);
        std::fs::write(path(corrupt), b"\x89PNG\r\n\x1a\n not really").unwrap();
        let folder = ImageFolder::open(dir.path()).unwrap();
        (dir, folder)
    }

    fn run(
        folder: &ImageFolder,
        policy: BadSamplePolicy,
        num_workers: usize,
    ) -> (Vec<Result<Batch, DataError>>, usize) {
        let config = LoaderConfig {
            batch_size: 2,
            num_workers,
            bad_samples: policy,
            ..LoaderConfig::default()
        };
        let pipeline = Arc::new(Pipeline::new().then(CenterCrop { size: 2 }));
        let indices = vec![4, 1, 2, 3, 0, 1];
        let mut loader =
            DataLoader::new(Arc::new(folder.clone()), pipeline, indices, config).unwrap();
        let batches = loader.by_ref().collect();
        (batches, loader.skipped_samples())
    }

    #[test]
    fn a_bad_sample_fails_its_batch_by_default() {
        let (dir, folder) = folder_with_bad_files(0, 2);
        let (batches, skipped) = run(&folder, BadSamplePolicy::default(), 0);
        assert_eq!(skipped, 0);
        assert!(batches[0].is_ok());
        let err = batches[1].as_ref().unwrap_err().to_string();
        let corrupt = dir.path().join("a/2.png");
        assert!(err.starts_with(&format!("cannot decode image {}", corrupt.display())));
        assert!(!err.contains('\n'), "{err}");
        let err = batches[2].as_ref().unwrap_err().to_string();
        assert!(err.contains("a/0.png: image 1x100000 refused"), "{err}");
    }

    /// Sample 2 (corrupt) becomes 3, sample 0 (oversized) becomes 1; batches keep their size,
    /// and batches and count are the same for any number of workers.
    #[test]
    fn skipped_samples_are_replaced_by_the_next_good_one_and_counted() {
        let (_dir, folder) = folder_with_bad_files(0, 2);
        let (batches, skipped) = run(&folder, BadSamplePolicy::Skip, 0);
        assert_eq!(skipped, 2);
        let batches: Vec<Batch> = batches.into_iter().map(Result::unwrap).collect();
        let indices: Vec<&[usize]> = batches.iter().map(|b| &b.indices[..]).collect();
        assert_eq!(indices, [&[4, 1][..], &[3, 3], &[1, 1]]);
        assert_eq!(batches[1].labels, [1, 1]);
        assert!(batches[0].skipped.is_empty());
        assert!(batches.iter().all(|b| b.shape == [2, 3, 2, 2]));
        let [first, second] = [&batches[1].skipped[0], &batches[2].skipped[0]];
        assert_eq!((first.index, first.replacement), (2, 3));
        assert!(first.reason.starts_with("cannot decode image"), "{first:?}");
        assert_eq!((second.index, second.replacement), (0, 1));
        assert!(second.reason.contains("1x100000"), "{second:?}");
        let (with_workers, counted) = run(&folder, BadSamplePolicy::Skip, 2);
        let with_workers: Vec<Batch> = with_workers.into_iter().map(Result::unwrap).collect();
        assert_eq!((with_workers, counted), (batches, skipped));
    }

    #[test]
    fn the_search_wraps_around_and_fails_when_nothing_is_good() {
        let (_dir, folder) = folder_with_bad_files(4, 3);
        let (sample, skipped) = load_sample(&folder, 3, BadSamplePolicy::Skip).unwrap();
        assert_eq!((sample.label, skipped.unwrap().replacement), (0, 0));
        let dir = image_tree(&[("a", "0.png")]);
        std::fs::write(dir.path().join("a/0.png"), b"garbage").unwrap();
        let folder = ImageFolder::open(dir.path()).unwrap();
        let err = load_sample(&folder, 0, BadSamplePolicy::Skip).unwrap_err();
        assert!(matches!(
            err,
            DataError::NoGoodSample {
                index: 0,
                len: 1,
                ..
            }
        ));
        assert!(!err.to_string().contains('\n'), "{err}");
    }
}
