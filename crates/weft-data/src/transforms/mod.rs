//! Seeded image transforms. Image-space transforms (`ImageTransform`) run on
//! 8-bit images and draw all randomness from the generator they are given, so
//! with `augmentation_rng(seed, epoch, index)` a sample's augmentation is
//! reproducible on any thread. A `Pipeline` chains them, converts to f32 CHW
//! in [0, 1] and optionally normalises.

mod geometric;
mod normalize;
mod pipeline;
mod resize;

use std::fmt::Debug;

use rand::RngCore;

use crate::{DataError, RgbImage};

pub use geometric::{CenterCrop, RandomCrop, RandomHorizontalFlip};
pub use normalize::{Normalize, CIFAR10_MEAN, CIFAR10_STD, IMAGENET_MEAN, IMAGENET_STD};
pub use pipeline::Pipeline;
pub use resize::{RandomResizedCrop, Resize};

/// A transform from one 8-bit RGB image to another.
pub trait ImageTransform: Send + Sync + Debug {
    /// Transforms `image`, drawing any randomness from `rng` only.
    fn apply(&self, image: RgbImage, rng: &mut dyn RngCore) -> Result<RgbImage, DataError>;
}
