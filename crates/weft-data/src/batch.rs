//! `Batch`: a stack of transformed samples in NCHW f32 layout with their
//! labels, and `BatchSource`, which builds batch `k` of an epoch from a
//! dataset, a pipeline and the epoch's index list.

use std::sync::Arc;

use candle_core::{Device, Tensor};

use crate::{augmentation_rng, DataError, Dataset, Pipeline};

/// Transformed samples stacked in NCHW order.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// `N * C * H * W` values, sample-major then channel, row, column.
    pub images: Vec<f32>,
    /// One label per sample.
    pub labels: Vec<u32>,
    /// `[N, C, H, W]`.
    pub shape: [usize; 4],
    /// The dataset index of each sample.
    pub indices: Vec<usize>,
}

impl Batch {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The images as an f32 `[N, C, H, W]` tensor and the labels as a u32 `[N]` tensor.
    pub fn to_tensors(&self, device: &Device) -> Result<(Tensor, Tensor), DataError> {
        let images = Tensor::from_slice(&self.images, &self.shape, device)?;
        let labels = Tensor::from_slice(&self.labels, self.labels.len(), device)?;
        Ok((images, labels))
    }
}

/// Everything needed to build any batch of one epoch, shareable across threads.
#[derive(Debug)]
pub(crate) struct BatchSource {
    pub dataset: Arc<dyn Dataset>,
    pub pipeline: Arc<Pipeline>,
    pub indices: Vec<usize>,
    pub batch_size: usize,
    pub drop_last: bool,
    pub seed: u64,
    pub epoch: u64,
}

impl BatchSource {
    /// Number of batches in the epoch (a partial last batch counts unless `drop_last`).
    pub fn num_batches(&self) -> usize {
        if self.drop_last {
            self.indices.len() / self.batch_size
        } else {
            self.indices.len().div_ceil(self.batch_size)
        }
    }

    /// Builds batch `batch` from `indices[batch * batch_size ..][.. batch_size]`;
    /// each sample's augmentation uses `augmentation_rng(seed, epoch, index)`.
    pub fn build(&self, batch: usize) -> Result<Batch, DataError> {
        let start = batch * self.batch_size;
        let end = (start + self.batch_size).min(self.indices.len());
        let indices = self.indices[start..end].to_vec();
        let mut images = Vec::new();
        let mut labels = Vec::with_capacity(indices.len());
        let mut sample_shape = None;
        for &index in &indices {
            let sample = self.dataset.get(index)?;
            let mut rng = augmentation_rng(self.seed, self.epoch, index);
            let image = self.pipeline.apply(sample.image, &mut rng)?;
            let expected = *sample_shape.get_or_insert(image.shape());
            if image.shape() != expected {
                return Err(DataError::ShapeMismatch {
                    batch,
                    index,
                    expected,
                    found: image.shape(),
                });
            }
            images.extend_from_slice(&image.data);
            labels.push(sample.label);
        }
        let [channels, height, width] = sample_shape.unwrap_or([0; 3]);
        Ok(Batch {
            images,
            labels,
            shape: [indices.len(), channels, height, width],
            indices,
        })
    }
}
