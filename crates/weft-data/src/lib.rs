//! weft-data: the input side of weft training, usable on its own.
//!
//! - Datasets behind one `Dataset` trait (`Send + Sync`, shared as
//!   `Arc<dyn Dataset>`): `SyntheticShapes` (procedural, learnable, any index
//!   generated independently from `(seed, index)`), `Cifar10` (binary format,
//!   memory-mapped) and `ImageFolder` (`root/<class>/<image>`, decoded lazily within
//!   `ImageLimits` checked from each header; `open_validation` checks `val/`'s classes
//!   against `train/`'s).
//! - Seeded transforms (`RandomCrop`, `RandomHorizontalFlip`, `Resize`,
//!   `CenterCrop`, `RandomResizedCrop`, `Normalize`) chained by a `Pipeline`
//!   with CIFAR and ImageNet presets; a sample's randomness comes from
//!   `augmentation_rng(seed, epoch, index)`, never from thread order.
//! - `DistributedSampler` with PyTorch's sharding semantics.
//! - Token streams for language models: `TokenWindows` (inputs and next-token targets by
//!   window index) over a `TokenStream` (tokens at the vocabulary's width; any file
//!   memory-mapped as byte tokens), and `MarkovTokens` (a learnable synthetic stream from a
//!   seed).
//! - `DataLoader`: ordered batches (`Batch`, NCHW f32 + u32 labels, convertible
//!   to Candle tensors) built by optional prefetching worker threads; a bad sample
//!   ends the run or is replaced and counted (`BadSamplePolicy`).
//!
//! ```no_run
//! use std::sync::Arc;
//! use weft_data::{DataLoader, DistributedSampler, LoaderConfig, Pipeline, SyntheticShapes};
//!
//! let dataset = Arc::new(SyntheticShapes::train(50_000, 0));
//! let mut sampler = DistributedSampler::new(50_000, 4, 0)?;
//! sampler.set_epoch(3);
//! let config = LoaderConfig { batch_size: 128, num_workers: 4, epoch: 3, ..LoaderConfig::default() };
//! let loader = DataLoader::new(dataset, Arc::new(Pipeline::cifar_train(32)), sampler.indices(), config)?;
//! for batch in loader {
//!     let (images, labels) = batch?.to_tensors(&candle_core::Device::Cpu)?;
//! }
//! # Ok::<(), weft_data::DataError>(())
//! ```

mod bad_samples;
mod batch;
mod cifar;
mod class_check;
mod dataset;
mod device_pixels;
mod error;
mod image_folder;
mod image_limits;
mod loader;
mod mapped;
mod markov;
mod pixels;
mod sampler;
mod seeding;
mod shapes;
mod synthetic;
#[cfg(test)]
mod test_images;
pub mod token_shards;
mod token_stream;
mod tokenizer;
mod tokens;
pub mod transforms;
mod workers;

pub use bad_samples::{BadSamplePolicy, SkippedSample};
pub use batch::{Batch, BatchImages};
pub use cifar::{Cifar10, Split, CIFAR10_CLASSES, CIFAR10_IMAGE_SIZE, CIFAR10_RECORD_BYTES};
pub use dataset::{Dataset, Sample};
pub use device_pixels::{pixels_to_float, pixels_to_float_into};
pub use error::DataError;
pub use image_folder::{ImageFolder, IMAGE_EXTENSIONS};
pub use image_limits::{decode_rgb_bytes, ImageLimits};
pub use loader::{DataLoader, LoaderConfig};
pub use markov::MarkovTokens;
pub use pixels::{ChwImage, RgbImage};
pub use sampler::DistributedSampler;
pub use seeding::augmentation_rng;
pub use shapes::SHAPE_NAMES;
pub use synthetic::{SyntheticConfig, SyntheticShapes, VALIDATION_SEED_SALT};
pub use token_stream::{TokenStream, TokenWidth};
pub use tokenizer::Tokenizer;
pub use tokens::{read_text_bytes, TokenWindows};
pub use transforms::{
    CenterCrop, ImageTransform, Normalize, Pipeline, RandomCrop, RandomHorizontalFlip,
    RandomResizedCrop, Resize, CIFAR10_MEAN, CIFAR10_STD, IMAGENET_MEAN, IMAGENET_STD,
};
