//! Resampling transforms built on the `image` crate's triangle (bilinear)
//! filter: `Resize` (shorter side) and `RandomResizedCrop` (torchvision's
//! algorithm: 10 random attempts, then a centre-crop fallback).

use image::imageops::{self, FilterType};
use rand::{Rng, RngCore};

use super::ImageTransform;
use crate::{DataError, RgbImage};

/// Resamples `image` to exactly `width` x `height` (returned unchanged if already that size).
fn resize_exact(image: RgbImage, width: usize, height: usize) -> RgbImage {
    if (image.width(), image.height()) == (width, height) {
        return image;
    }
    let buffer = image.into_image_buffer();
    let resized = imageops::resize(&buffer, width as u32, height as u32, FilterType::Triangle);
    RgbImage::from_image_buffer(resized)
}

fn empty_image_error(transform: &'static str, image: &RgbImage) -> DataError {
    DataError::Transform {
        transform,
        reason: format!(
            "cannot resample an empty {}x{} image",
            image.width(),
            image.height()
        ),
    }
}

/// Scales the image so its shorter side is `shorter_side`, keeping the aspect
/// ratio; the longer side is `floor(shorter_side * long / short)` like torchvision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resize {
    pub shorter_side: usize,
}

impl ImageTransform for Resize {
    fn apply(&self, image: RgbImage, _rng: &mut dyn RngCore) -> Result<RgbImage, DataError> {
        let (width, height) = (image.width(), image.height());
        if width == 0 || height == 0 {
            return Err(empty_image_error("Resize", &image));
        }
        if self.shorter_side == 0 {
            return Err(DataError::Transform {
                transform: "Resize",
                reason: "shorter_side is zero".to_string(),
            });
        }
        let target = self.shorter_side;
        let (new_width, new_height) = if width <= height {
            (target, target * height / width)
        } else {
            (target * width / height, target)
        };
        Ok(resize_exact(image, new_width, new_height))
    }
}

/// Crops a random region covering a `scale` fraction of the area with an
/// aspect ratio (width / height) in `ratio` (sampled log-uniformly), then
/// resizes it to `size` x `size`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomResizedCrop {
    pub size: usize,
    pub scale: (f64, f64),
    pub ratio: (f64, f64),
}

impl RandomResizedCrop {
    /// torchvision's defaults: `scale = (0.08, 1.0)`, `ratio = (3/4, 4/3)`.
    pub fn new(size: usize) -> Self {
        Self {
            size,
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
        }
    }

    fn validate(&self) -> Result<(), DataError> {
        let ordered_positive =
            |(low, high): (f64, f64)| low > 0.0 && low <= high && high.is_finite();
        let reason = if self.size == 0 {
            "output size is zero".to_string()
        } else if !ordered_positive(self.scale) {
            format!("scale {:?} must satisfy 0 < min <= max", self.scale)
        } else if !ordered_positive(self.ratio) {
            format!("ratio {:?} must satisfy 0 < min <= max", self.ratio)
        } else {
            return Ok(());
        };
        Err(DataError::Transform {
            transform: "RandomResizedCrop",
            reason,
        })
    }

    /// torchvision's `get_params`: the crop as (top, left, height, width).
    fn crop_window(&self, width: usize, height: usize, rng: &mut dyn RngCore) -> [usize; 4] {
        let area = (width * height) as f64;
        let (log_low, log_high) = (self.ratio.0.ln(), self.ratio.1.ln());
        let uniform =
            |rng: &mut dyn RngCore, low: f64, high: f64| low + (high - low) * rng.gen::<f64>();
        for _ in 0..10 {
            let target_area = area * uniform(rng, self.scale.0, self.scale.1);
            let aspect = uniform(rng, log_low, log_high).exp();
            let crop_width = (target_area * aspect).sqrt().round_ties_even() as usize;
            let crop_height = (target_area / aspect).sqrt().round_ties_even() as usize;
            if (1..=width).contains(&crop_width) && (1..=height).contains(&crop_height) {
                let top = rng.gen_range(0..=height - crop_height);
                let left = rng.gen_range(0..=width - crop_width);
                return [top, left, crop_height, crop_width];
            }
        }
        let in_ratio = width as f64 / height as f64;
        let (crop_width, crop_height) = if in_ratio < self.ratio.0 {
            (
                width,
                ((width as f64 / self.ratio.0).round_ties_even() as usize).clamp(1, height),
            )
        } else if in_ratio > self.ratio.1 {
            (
                ((height as f64 * self.ratio.1).round_ties_even() as usize).clamp(1, width),
                height,
            )
        } else {
            (width, height)
        };
        [
            (height - crop_height) / 2,
            (width - crop_width) / 2,
            crop_height,
            crop_width,
        ]
    }
}

impl ImageTransform for RandomResizedCrop {
    fn apply(&self, image: RgbImage, rng: &mut dyn RngCore) -> Result<RgbImage, DataError> {
        self.validate()?;
        if image.width() == 0 || image.height() == 0 {
            return Err(empty_image_error("RandomResizedCrop", &image));
        }
        let [top, left, height, width] = self.crop_window(image.width(), image.height(), rng);
        let buffer = image.into_image_buffer();
        let window = imageops::crop_imm(
            &buffer,
            left as u32,
            top as u32,
            width as u32,
            height as u32,
        );
        let resized = imageops::resize(
            &*window,
            self.size as u32,
            self.size as u32,
            FilterType::Triangle,
        );
        Ok(RgbImage::from_image_buffer(resized))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::augmentation_rng;

    fn gradient(width: usize, height: usize) -> RgbImage {
        let data = (0..width * height * 3).map(|i| (i % 251) as u8).collect();
        RgbImage::new(width, height, data).unwrap()
    }

    #[test]
    fn resize_sets_shorter_side_and_keeps_aspect() {
        let mut rng = augmentation_rng(0, 0, 0);
        let wide = Resize { shorter_side: 10 }
            .apply(gradient(30, 20), &mut rng)
            .unwrap();
        assert_eq!((wide.width(), wide.height()), (15, 10));
        let tall = Resize { shorter_side: 7 }
            .apply(gradient(20, 30), &mut rng)
            .unwrap();
        assert_eq!((tall.width(), tall.height()), (7, 10));
    }

    #[test]
    fn resize_of_a_constant_image_stays_constant() {
        let image = RgbImage::new(8, 6, [40u8, 80, 120].repeat(48)).unwrap();
        let out = Resize { shorter_side: 3 }
            .apply(image, &mut augmentation_rng(0, 0, 0))
            .unwrap();
        assert_eq!((out.width(), out.height()), (4, 3));
        assert!(out.data().chunks(3).all(|p| p == [40, 80, 120]));
    }

    #[test]
    fn random_resized_crop_has_output_size_and_is_deterministic() {
        let transform = RandomResizedCrop::new(12);
        let mut distinct = std::collections::HashSet::new();
        for index in 0..8 {
            let out = transform
                .apply(gradient(40, 25), &mut augmentation_rng(5, 1, index))
                .unwrap();
            assert_eq!((out.width(), out.height()), (12, 12));
            let again = transform
                .apply(gradient(40, 25), &mut augmentation_rng(5, 1, index))
                .unwrap();
            assert_eq!(out, again);
            distinct.insert(out.into_data());
        }
        assert!(
            distinct.len() > 1,
            "different seeds should give different crops"
        );
    }

    #[test]
    fn crop_windows_satisfy_scale_and_ratio_or_fall_back_to_centre() {
        let transform = RandomResizedCrop::new(8);
        for index in 0..200 {
            let [top, left, h, w] =
                transform.crop_window(50, 40, &mut augmentation_rng(9, 0, index));
            assert!(top + h <= 40 && left + w <= 50 && h > 0 && w > 0);
        }
        // scale > 1 can never fit: an extreme aspect falls back to a centred crop.
        let impossible = RandomResizedCrop {
            size: 8,
            scale: (2.0, 3.0),
            ratio: (1.0, 1.0),
        };
        let window = impossible.crop_window(30, 10, &mut augmentation_rng(0, 0, 0));
        assert_eq!(window, [0, 10, 10, 10]);
    }

    #[test]
    fn invalid_parameters_are_errors() {
        let bad = RandomResizedCrop {
            size: 8,
            scale: (0.5, 0.1),
            ratio: (0.75, 1.33),
        };
        let err = bad
            .apply(gradient(4, 4), &mut augmentation_rng(0, 0, 0))
            .unwrap_err();
        assert!(err.to_string().contains("scale"), "{err}");
    }
}
