//! `Batch`: a stack of transformed samples — normalised f32 in NCHW order, or the pixels'
//! bytes in NHWC order for the device to convert — with their labels, and `BatchSource`,
//! which builds batch `k` of an epoch from a dataset, a pipeline and the epoch's index list
//! (bad samples failing the batch or replaced, as the [`BadSamplePolicy`] says).

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use crate::bad_samples::load_sample;
use crate::{
    augmentation_rng, pixels_to_float, BadSamplePolicy, DataError, Dataset, Normalize, Pipeline,
    SkippedSample,
};

/// A batch's images, as the host finished them.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchImages {
    /// `N * C * H * W` normalised values, sample-major then channel, row, column.
    Float(Vec<f32>),
    /// `N * H * W * C` bytes (each sample's pixels row by row, RGB), to be converted to float
    /// and normalised by `normalize` where they are used ([`pixels_to_float`]): a quarter of
    /// the bytes to build, copy and upload.
    Pixels {
        data: Vec<u8>,
        normalize: Option<Normalize>,
    },
}

/// Transformed samples stacked in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub images: BatchImages,
    /// One label per sample.
    pub labels: Vec<u32>,
    /// `[N, C, H, W]` (the logical shape, whichever the order of `images`).
    pub shape: [usize; 4],
    /// The dataset index of each sample (a replaced bad sample's replacement).
    pub indices: Vec<usize>,
    /// The bad samples replaced in this batch under [`BadSamplePolicy::Skip`], in order.
    pub skipped: Vec<SkippedSample>,
}

impl Batch {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The images as a contiguous f32 `[N, C, H, W]` tensor (pixels converted and normalised
    /// on `device`) and the labels as a u32 `[N]` tensor.
    pub fn to_tensors(&self, device: &Device) -> Result<(Tensor, Tensor), DataError> {
        let images = match &self.images {
            BatchImages::Float(values) => Tensor::from_slice(values, &self.shape, device)?,
            BatchImages::Pixels { data, normalize } => {
                let [n, c, h, w] = self.shape;
                let pixels = Tensor::from_slice(data, (n, h, w, c), device)?;
                pixels_to_float(&pixels, normalize.as_ref(), DType::F32)?.contiguous()?
            }
        };
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
    /// Hand over the pixels' bytes ([`BatchImages::Pixels`]) instead of normalised floats.
    pub pixels: bool,
    pub bad_samples: BadSamplePolicy,
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
    /// each sample's augmentation uses `augmentation_rng(seed, epoch, index)` (a replaced
    /// sample's replacement the bad sample's).
    pub fn build(&self, batch: usize) -> Result<Batch, DataError> {
        let start = batch * self.batch_size;
        let end = (start + self.batch_size).min(self.indices.len());
        let mut indices = Vec::with_capacity(end - start);
        let mut skipped = Vec::new();
        let (mut floats, mut pixels) = (Vec::new(), Vec::new());
        let mut labels = Vec::with_capacity(end - start);
        let mut sample_shape = None;
        for &slot in &self.indices[start..end] {
            let (sample, replaced) = load_sample(&*self.dataset, slot, self.bad_samples)?;
            let mut rng = augmentation_rng(self.seed, self.epoch, slot);
            let index = replaced.as_ref().map_or(slot, |r| r.replacement);
            skipped.extend(replaced);
            let shape = match self.pixels {
                true => {
                    let image = self.pipeline.apply_pixels(sample.image, &mut rng)?;
                    pixels.extend_from_slice(image.data());
                    [3, image.height(), image.width()]
                }
                false => {
                    let image = self.pipeline.apply(sample.image, &mut rng)?;
                    floats.extend_from_slice(&image.data);
                    image.shape()
                }
            };
            let expected = *sample_shape.get_or_insert(shape);
            if shape != expected {
                return Err(DataError::ShapeMismatch {
                    batch,
                    index,
                    expected,
                    found: shape,
                });
            }
            labels.push(sample.label);
            indices.push(index);
        }
        let [channels, height, width] = sample_shape.unwrap_or([0; 3]);
        let images = match self.pixels {
            true => BatchImages::Pixels {
                data: pixels,
                normalize: self.pipeline.normalization(),
            },
            false => BatchImages::Float(floats),
        };
        Ok(Batch {
            images,
            labels,
            shape: [indices.len(), channels, height, width],
            indices,
            skipped,
        })
    }
}
