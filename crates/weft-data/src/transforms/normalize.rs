//! Per-channel normalisation of float CHW images, `(x - mean) / std`, and the
//! standard CIFAR-10 and ImageNet statistics.

use crate::{ChwImage, DataError};

pub const CIFAR10_MEAN: [f32; 3] = [0.4914, 0.4822, 0.4465];
pub const CIFAR10_STD: [f32; 3] = [0.2470, 0.2435, 0.2616];
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Subtracts `mean[c]` from channel `c` and divides by `std[c]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normalize {
    mean: [f32; 3],
    std: [f32; 3],
}

impl Normalize {
    /// Every `std` entry must be finite and positive, every `mean` finite.
    pub fn new(mean: [f32; 3], std: [f32; 3]) -> Result<Self, DataError> {
        if !mean.iter().all(|m| m.is_finite()) {
            return Err(DataError::InvalidConfig {
                field: "Normalize::mean",
                reason: format!("{mean:?} has a non-finite entry"),
            });
        }
        if !std.iter().all(|s| s.is_finite() && *s > 0.0) {
            return Err(DataError::InvalidConfig {
                field: "Normalize::std",
                reason: format!("{std:?} has an entry that is not finite and positive"),
            });
        }
        Ok(Self { mean, std })
    }

    /// `CIFAR10_MEAN` / `CIFAR10_STD`.
    pub fn cifar10() -> Self {
        Self {
            mean: CIFAR10_MEAN,
            std: CIFAR10_STD,
        }
    }

    /// `IMAGENET_MEAN` / `IMAGENET_STD`.
    pub fn imagenet() -> Self {
        Self {
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
        }
    }

    pub fn mean(&self) -> [f32; 3] {
        self.mean
    }

    pub fn std(&self) -> [f32; 3] {
        self.std
    }

    /// Normalises `image` in place; it must have 3 channels.
    pub fn apply(&self, image: &mut ChwImage) -> Result<(), DataError> {
        if image.channels != 3 {
            return Err(DataError::Transform {
                transform: "Normalize",
                reason: format!("expected 3 channels, got {}", image.channels),
            });
        }
        let plane = image.height * image.width;
        if plane == 0 {
            return Ok(());
        }
        for (c, values) in image.data.chunks_exact_mut(plane).enumerate() {
            let (mean, inverse_std) = (self.mean[c], 1.0 / self.std[c]);
            for value in values {
                *value = (*value - mean) * inverse_std;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_matches_hand_computed_values() {
        let mut image = ChwImage {
            channels: 3,
            height: 1,
            width: 2,
            data: vec![0.0, 1.0, 0.5, 0.25, 0.2, 0.8],
        };
        let normalize = Normalize::new([0.5, 0.25, 0.4], [0.5, 0.25, 0.2]).unwrap();
        normalize.apply(&mut image).unwrap();
        let expected = [-1.0, 1.0, 1.0, 0.0, -1.0, 2.0];
        for (got, want) in image.data.iter().zip(expected) {
            assert!((got - want).abs() < 1e-6, "{:?}", image.data);
        }
    }

    #[test]
    fn cifar_statistics_map_mean_to_zero() {
        let mut image = ChwImage {
            channels: 3,
            height: 1,
            width: 1,
            data: CIFAR10_MEAN.to_vec(),
        };
        Normalize::cifar10().apply(&mut image).unwrap();
        assert!(image.data.iter().all(|v| v.abs() < 1e-6));
        // Pixel value 1.0 in the red channel: (1 - 0.4914) / 0.2470.
        let mut white = ChwImage {
            data: vec![1.0; 3],
            ..image
        };
        Normalize::cifar10().apply(&mut white).unwrap();
        assert!(
            (white.data[0] - 2.059_109).abs() < 1e-5,
            "{}",
            white.data[0]
        );
    }

    #[test]
    fn rejects_bad_std_and_channel_count() {
        assert!(Normalize::new([0.0; 3], [1.0, 0.0, 1.0]).is_err());
        let mut gray = ChwImage {
            channels: 1,
            height: 1,
            width: 1,
            data: vec![0.0],
        };
        assert!(Normalize::imagenet().apply(&mut gray).is_err());
    }
}
