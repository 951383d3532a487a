//! Crops and flips on 8-bit images: `RandomCrop` (with zero padding),
//! `CenterCrop` and `RandomHorizontalFlip`, following torchvision.

use rand::{Rng, RngCore};

use super::ImageTransform;
use crate::{DataError, RgbImage};

/// Copies the `height` x `width` window whose top-left corner is at
/// (`top`, `left`) in `image` coordinates; pixels outside `image` are black.
pub(crate) fn crop_zero_padded(
    image: &RgbImage,
    top: i64,
    left: i64,
    height: usize,
    width: usize,
) -> RgbImage {
    let mut output = RgbImage::black(width, height);
    for y in 0..height {
        let source_y = top + y as i64;
        if source_y < 0 || source_y >= image.height() as i64 {
            continue;
        }
        for x in 0..width {
            let source_x = left + x as i64;
            if source_x >= 0 && source_x < image.width() as i64 {
                output.set_pixel(x, y, image.pixel(source_x as usize, source_y as usize));
            }
        }
    }
    output
}

/// Pads every side with `padding` black pixels, then crops a uniformly random
/// `size` x `size` window (torchvision `RandomCrop(size, padding)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RandomCrop {
    pub size: usize,
    pub padding: usize,
}

impl ImageTransform for RandomCrop {
    fn apply(&self, image: RgbImage, rng: &mut dyn RngCore) -> Result<RgbImage, DataError> {
        let padded_height = image.height() + 2 * self.padding;
        let padded_width = image.width() + 2 * self.padding;
        if self.size == 0 || self.size > padded_height || self.size > padded_width {
            return Err(DataError::Transform {
                transform: "RandomCrop",
                reason: format!(
                    "crop size {} does not fit a {}x{} image padded by {} (or is zero)",
                    self.size,
                    image.width(),
                    image.height(),
                    self.padding
                ),
            });
        }
        let top = rng.gen_range(0..=padded_height - self.size) as i64 - self.padding as i64;
        let left = rng.gen_range(0..=padded_width - self.size) as i64 - self.padding as i64;
        Ok(crop_zero_padded(&image, top, left, self.size, self.size))
    }
}

/// Crops the central `size` x `size` window (torchvision `CenterCrop`): the
/// offset is `round((image - size) / 2)` with ties to even, and an image
/// smaller than `size` is padded with black.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CenterCrop {
    pub size: usize,
}

/// torchvision's centre offset along one axis, negative when padding is needed.
fn center_offset(image_extent: usize, crop_extent: usize) -> i64 {
    if crop_extent > image_extent {
        -(((crop_extent - image_extent) / 2) as i64)
    } else {
        ((image_extent - crop_extent) as f64 / 2.0).round_ties_even() as i64
    }
}

impl ImageTransform for CenterCrop {
    fn apply(&self, image: RgbImage, _rng: &mut dyn RngCore) -> Result<RgbImage, DataError> {
        if self.size == 0 {
            return Err(DataError::Transform {
                transform: "CenterCrop",
                reason: "crop size is zero".to_string(),
            });
        }
        let top = center_offset(image.height(), self.size);
        let left = center_offset(image.width(), self.size);
        Ok(crop_zero_padded(&image, top, left, self.size, self.size))
    }
}

/// Mirrors the image left-right with probability `p`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomHorizontalFlip {
    pub p: f64,
}

impl Default for RandomHorizontalFlip {
    fn default() -> Self {
        Self { p: 0.5 }
    }
}

impl ImageTransform for RandomHorizontalFlip {
    fn apply(&self, image: RgbImage, rng: &mut dyn RngCore) -> Result<RgbImage, DataError> {
        if !(0.0..=1.0).contains(&self.p) {
            return Err(DataError::Transform {
                transform: "RandomHorizontalFlip",
                reason: format!("probability {} is not in [0, 1]", self.p),
            });
        }
        if rng.gen::<f64>() >= self.p {
            return Ok(image);
        }
        let (width, height) = (image.width(), image.height());
        let mut data = image.into_data();
        if width > 0 {
            for row in data.chunks_exact_mut(width * 3) {
                // Reversing the row reverses pixel order and channel order;
                // reversing each pixel restores the channel order.
                row.reverse();
                row.chunks_exact_mut(3).for_each(<[u8]>::reverse);
            }
        }
        RgbImage::new(width, height, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::augmentation_rng;

    /// A width x height image whose pixel (x, y) is [x, y, 100 + x + y].
    fn coordinate_image(width: usize, height: usize) -> RgbImage {
        let mut image = RgbImage::black(width, height);
        for y in 0..height {
            for x in 0..width {
                image.set_pixel(x, y, [x as u8, y as u8, (100 + x + y) as u8]);
            }
        }
        image
    }

    #[test]
    fn horizontal_flip_mirrors_exactly_or_not_at_all() {
        let image = coordinate_image(5, 2);
        let mut rng = augmentation_rng(0, 0, 0);
        let flipped = RandomHorizontalFlip { p: 1.0 }
            .apply(image.clone(), &mut rng)
            .unwrap();
        for y in 0..2 {
            for x in 0..5 {
                assert_eq!(flipped.pixel(x, y), image.pixel(4 - x, y));
            }
        }
        let kept = RandomHorizontalFlip { p: 0.0 }
            .apply(image.clone(), &mut rng)
            .unwrap();
        assert_eq!(kept, image);
        assert!(RandomHorizontalFlip { p: 2.0 }
            .apply(image, &mut rng)
            .is_err());
    }

    #[test]
    fn random_crop_with_padding_has_size_and_zero_border() {
        let image = RgbImage::new(4, 4, vec![255; 48]).unwrap();
        let crop = RandomCrop {
            size: 4,
            padding: 2,
        };
        let mut saw_padding = false;
        for index in 0..50 {
            let out = crop
                .apply(image.clone(), &mut augmentation_rng(1, 0, index))
                .unwrap();
            assert_eq!((out.width(), out.height()), (4, 4));
            assert!(out.data().iter().all(|&v| v == 0 || v == 255));
            saw_padding |= out.data().contains(&0);
        }
        assert!(saw_padding);
    }

    #[test]
    fn random_crop_is_a_window_of_the_padded_image() {
        let image = coordinate_image(6, 6);
        let out = RandomCrop {
            size: 4,
            padding: 0,
        }
        .apply(image.clone(), &mut augmentation_rng(2, 0, 0))
        .unwrap();
        let [left, top, _] = out.pixel(0, 0).map(usize::from);
        assert_eq!(out, crop_zero_padded(&image, top as i64, left as i64, 4, 4));
        let too_big = RandomCrop {
            size: 9,
            padding: 1,
        };
        assert!(too_big
            .apply(image, &mut augmentation_rng(0, 0, 0))
            .is_err());
    }

    #[test]
    fn center_crop_takes_exact_central_pixels() {
        let image = coordinate_image(5, 4);
        let out = CenterCrop { size: 2 }
            .apply(image, &mut augmentation_rng(0, 0, 0))
            .unwrap();
        // Left offset round(1.5) = 2, top offset round(1.0) = 1.
        assert_eq!(out.pixel(0, 0), [2, 1, 103]);
        assert_eq!(out.pixel(1, 1), [3, 2, 105]);
    }

    #[test]
    fn center_crop_pads_small_images_with_black() {
        let image = RgbImage::new(1, 1, vec![9, 9, 9]).unwrap();
        let out = CenterCrop { size: 3 }
            .apply(image, &mut augmentation_rng(0, 0, 0))
            .unwrap();
        assert_eq!(out.pixel(1, 1), [9, 9, 9]);
        assert_eq!(out.data().iter().filter(|&&v| v == 9).count(), 3);
    }
}
