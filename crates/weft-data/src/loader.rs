//! `DataLoader`: iterates one epoch of batches, in order, optionally built by
//! background worker threads that prefetch ahead of the consumer. Sample `i`
//! is augmented with `augmentation_rng(seed, epoch, i)`, so batches are
//! identical for any number of workers. Bad samples end the run or are replaced
//! and counted ([`crate::BadSamplePolicy`]).

use std::sync::Arc;

use crate::batch::BatchSource;
use crate::workers::Workers;
use crate::{BadSamplePolicy, Batch, DataError, Dataset, Pipeline};

/// How a `DataLoader` batches and prefetches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderConfig {
    /// Samples per batch (at least 1).
    pub batch_size: usize,
    /// Skip a final batch smaller than `batch_size`.
    pub drop_last: bool,
    /// Background threads; 0 builds each batch on the calling thread when asked.
    pub num_workers: usize,
    /// Batches in flight per worker, like PyTorch's `prefetch_factor` (at least 1).
    pub prefetch_factor: usize,
    /// Base seed of the augmentation randomness.
    pub seed: u64,
    /// Epoch number mixed into the augmentation randomness.
    pub epoch: u64,
    /// Hand over each batch's pixels as bytes ([`crate::BatchImages::Pixels`]), converted to
    /// float and normalised where the batch goes (a GPU), instead of normalised floats.
    pub pixels: bool,
    /// A bad sample (undecodable, over the image limits) fails its batch (the default) or is
    /// replaced and counted ([`DataLoader::skipped_samples`]).
    pub bad_samples: BadSamplePolicy,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        Self {
            batch_size: 1,
            drop_last: false,
            num_workers: 0,
            prefetch_factor: 2,
            seed: 0,
            epoch: 0,
            pixels: false,
            bad_samples: BadSamplePolicy::Fail,
        }
    }
}

/// An iterator over one epoch's batches: batch `k` holds the samples of
/// `indices[k * batch_size ..][.. batch_size]`. Dropping it early stops and
/// joins its workers.
#[derive(Debug)]
pub struct DataLoader {
    source: Arc<BatchSource>,
    next_batch: usize,
    workers: Option<Workers>,
    /// Bad samples replaced in the batches handed out so far.
    skipped: usize,
}

impl DataLoader {
    /// Prepares an epoch over `indices` (e.g. from `DistributedSampler::indices`)
    /// and, if `config.num_workers > 0`, starts the workers.
    pub fn new(
        dataset: Arc<dyn Dataset>,
        pipeline: Arc<Pipeline>,
        indices: Vec<usize>,
        config: LoaderConfig,
    ) -> Result<Self, DataError> {
        if config.batch_size == 0 {
            return Err(DataError::InvalidConfig {
                field: "LoaderConfig::batch_size",
                reason: "must be at least 1".to_string(),
            });
        }
        if config.prefetch_factor == 0 {
            return Err(DataError::InvalidConfig {
                field: "LoaderConfig::prefetch_factor",
                reason: "must be at least 1".to_string(),
            });
        }
        if let Some(&index) = indices.iter().find(|&&i| i >= dataset.len()) {
            return Err(DataError::IndexOutOfRange {
                index,
                len: dataset.len(),
            });
        }
        let source = Arc::new(BatchSource {
            dataset,
            pipeline,
            indices,
            batch_size: config.batch_size,
            drop_last: config.drop_last,
            seed: config.seed,
            epoch: config.epoch,
            pixels: config.pixels,
            bad_samples: config.bad_samples,
        });
        let workers = match config.num_workers {
            0 => None,
            n => Some(Workers::spawn(
                source.clone(),
                n,
                n * config.prefetch_factor,
            )?),
        };
        Ok(Self {
            source,
            next_batch: 0,
            workers,
            skipped: 0,
        })
    }

    /// Total number of batches in the epoch.
    pub fn num_batches(&self) -> usize {
        self.source.num_batches()
    }

    /// Bad samples replaced (under [`BadSamplePolicy::Skip`]) in the batches this loader has
    /// handed out: after the last one, the epoch's count on this rank. It counts delivered
    /// batches only, so it does not depend on how far the workers have read ahead.
    pub fn skipped_samples(&self) -> usize {
        self.skipped
    }
}

impl Iterator for DataLoader {
    type Item = Result<Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        let batch = self.next_batch;
        if batch >= self.num_batches() {
            return None;
        }
        self.next_batch += 1;
        let result = match &mut self.workers {
            Some(workers) => workers.take(batch),
            None => self.source.build(batch),
        };
        if let Ok(batch) = &result {
            self.skipped += batch.skipped.len();
        }
        Some(result)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let remaining = self.num_batches() - self.next_batch;
        (remaining, Some(remaining))
    }
}

impl ExactSizeIterator for DataLoader {}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::{BatchImages, RgbImage, Sample, SyntheticShapes};

    /// A dataset computing each sample with a closure.
    struct FnDataset<F>(usize, F);

    impl<F: Fn(usize) -> Sample + Send + Sync> Dataset for FnDataset<F> {
        fn len(&self) -> usize {
            self.0
        }
        fn get(&self, index: usize) -> Result<Sample, DataError> {
            Ok((self.1)(index))
        }
        fn num_classes(&self) -> usize {
            7
        }
    }

    /// Sample i: a 1x1 image of value i, label i % 7, taking (i % 3) ms to produce.
    fn uneven_dataset(len: usize) -> Arc<dyn Dataset> {
        Arc::new(FnDataset(len, |i: usize| {
            std::thread::sleep(Duration::from_millis((i % 3) as u64));
            Sample {
                image: RgbImage::new(1, 1, vec![i as u8; 3]).unwrap(),
                label: (i % 7) as u32,
            }
        }))
    }

    fn config(batch_size: usize, num_workers: usize) -> LoaderConfig {
        LoaderConfig {
            batch_size,
            num_workers,
            ..LoaderConfig::default()
        }
    }

    #[test]
    fn batches_come_in_index_order_with_three_workers() {
        let indices: Vec<usize> = (0..40).rev().collect();
        let loader = DataLoader::new(
            uneven_dataset(40),
            Arc::new(Pipeline::new()),
            indices.clone(),
            config(3, 3),
        )
        .unwrap();
        assert_eq!(loader.len(), 14);
        let batches: Vec<Batch> = loader.map(Result::unwrap).collect();
        for (batch, expected) in batches.iter().zip(indices.chunks(3)) {
            assert_eq!(batch.indices, expected);
            let labels: Vec<u32> = expected.iter().map(|&i| (i % 7) as u32).collect();
            assert_eq!(batch.labels, labels);
            assert_eq!(batch.shape, [expected.len(), 3, 1, 1]);
            let BatchImages::Float(images) = &batch.images else {
                panic!("floats unless asked for pixels");
            };
            assert_eq!(
                images[3 * (expected.len() - 1)],
                expected[expected.len() - 1] as f32 / 255.0
            );
        }
        assert_eq!(batches.len(), 14);
    }

    #[test]
    fn augmented_batches_do_not_depend_on_worker_count() {
        let dataset: Arc<dyn Dataset> = Arc::new(SyntheticShapes::train(20, 1));
        let pipeline = Arc::new(Pipeline::cifar_train(32));
        let run = |num_workers: usize, epoch: u64| -> Vec<Batch> {
            let config = LoaderConfig {
                seed: 5,
                epoch,
                ..config(6, num_workers)
            };
            let indices = (0..20).collect();
            DataLoader::new(dataset.clone(), pipeline.clone(), indices, config)
                .unwrap()
                .map(Result::unwrap)
                .collect()
        };
        let synchronous = run(0, 2);
        assert_eq!(synchronous, run(3, 2));
        assert_ne!(
            synchronous,
            run(0, 3),
            "another epoch must augment differently"
        );
    }

    #[test]
    fn drop_last_controls_the_partial_batch() {
        let sizes = |drop_last: bool, workers: usize| -> Vec<usize> {
            let config = LoaderConfig {
                drop_last,
                ..config(4, workers)
            };
            let loader = DataLoader::new(
                uneven_dataset(10),
                Arc::new(Pipeline::new()),
                (0..10).collect(),
                config,
            )
            .unwrap();
            loader.map(|b| b.unwrap().len()).collect()
        };
        assert_eq!(sizes(false, 0), [4, 4, 2]);
        assert_eq!(sizes(true, 0), [4, 4]);
        assert_eq!(sizes(true, 2), [4, 4]);
    }

    #[test]
    fn dropping_early_stops_and_joins_workers() {
        let dataset: Arc<dyn Dataset> = Arc::new(FnDataset(1000, |i: usize| {
            std::thread::sleep(Duration::from_millis(5));
            Sample {
                image: RgbImage::black(2, 2),
                label: (i % 7) as u32,
            }
        }));
        let start = Instant::now();
        let mut loader = DataLoader::new(
            dataset.clone(),
            Arc::new(Pipeline::new()),
            (0..1000).collect(),
            config(10, 4),
        )
        .unwrap();
        assert!(loader.next().unwrap().is_ok());
        drop(loader);
        assert_eq!(
            Arc::strong_count(&dataset),
            1,
            "workers still hold the dataset"
        );
        // The workers stopped (a generous bound: a hang would never end).
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "took {:?}",
            start.elapsed()
        );
    }

    #[test]
    fn a_panicking_sample_becomes_an_error_for_its_batch_only() {
        let dataset: Arc<dyn Dataset> = Arc::new(FnDataset(8, |i: usize| {
            assert_ne!(i, 3, "sample three is broken");
            Sample {
                image: RgbImage::black(1, 1),
                label: 0,
            }
        }));
        let results: Vec<_> = DataLoader::new(
            dataset,
            Arc::new(Pipeline::new()),
            (0..8).collect(),
            config(2, 2),
        )
        .unwrap()
        .collect();
        assert_eq!(results.len(), 4);
        let err = results[1].as_ref().unwrap_err().to_string();
        assert!(
            err.contains("batch 1") && err.contains("sample three is broken"),
            "{err}"
        );
        assert!(results[0].is_ok() && results[2].is_ok() && results[3].is_ok());
    }

    #[test]
    fn mismatched_sample_shapes_are_an_error() {
        let dataset: Arc<dyn Dataset> = Arc::new(FnDataset(2, |i: usize| Sample {
            image: RgbImage::black(1 + i, 1),
            label: 0,
        }));
        let mut loader =
            DataLoader::new(dataset, Arc::new(Pipeline::new()), vec![0, 1], config(2, 0)).unwrap();
        let err = loader.next().unwrap().unwrap_err();
        assert!(
            matches!(
                err,
                DataError::ShapeMismatch {
                    index: 1,
                    expected: [3, 1, 1],
                    found: [3, 1, 2],
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn invalid_configuration_is_rejected() {
        let pipeline = Arc::new(Pipeline::new());
        assert!(
            DataLoader::new(uneven_dataset(4), pipeline.clone(), vec![0], config(0, 0)).is_err()
        );
        let err =
            DataLoader::new(uneven_dataset(4), pipeline, vec![0, 4], config(1, 0)).unwrap_err();
        assert!(matches!(
            err,
            DataError::IndexOutOfRange { index: 4, len: 4 }
        ));
    }

    #[test]
    fn batches_convert_to_tensors() {
        let mut loader = DataLoader::new(
            uneven_dataset(5),
            Arc::new(Pipeline::new()),
            vec![4, 2],
            config(2, 0),
        )
        .unwrap();
        let (images, labels) = loader
            .next()
            .unwrap()
            .unwrap()
            .to_tensors(&candle_core::Device::Cpu)
            .unwrap();
        assert_eq!(images.dims(), [2, 3, 1, 1]);
        assert_eq!(images.dtype(), candle_core::DType::F32);
        assert_eq!(labels.to_vec1::<u32>().unwrap(), [4, 2]);
    }

    /// Pixels handed over as bytes and converted where they go (here the CPU) are the host
    /// pipeline's normalised floats exactly: the same f32 operations in the same order.
    #[test]
    fn pixels_converted_on_the_device_equal_the_hosts_floats() {
        let dataset: Arc<dyn Dataset> = Arc::new(SyntheticShapes::train(10, 3));
        let pipeline = Arc::new(Pipeline::cifar_train(32));
        let run = |pixels: bool| -> Vec<Vec<f32>> {
            let config = LoaderConfig {
                pixels,
                ..config(4, 2)
            };
            DataLoader::new(dataset.clone(), pipeline.clone(), (0..10).collect(), config)
                .unwrap()
                .map(|batch| {
                    let batch = batch.unwrap();
                    assert_eq!(matches!(batch.images, BatchImages::Pixels { .. }), pixels);
                    let (images, _) = batch.to_tensors(&candle_core::Device::Cpu).unwrap();
                    assert_eq!(images.dims(), [batch.len(), 3, 32, 32]);
                    images.flatten_all().unwrap().to_vec1().unwrap()
                })
                .collect()
        };
        assert_eq!(run(true), run(false));
    }
}
