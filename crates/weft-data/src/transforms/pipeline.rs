//! `Pipeline`: image transforms in order, then conversion to f32 CHW in
//! [0, 1] (like torchvision `ToTensor`), then optional normalisation; plus
//! the standard CIFAR and ImageNet presets.

use rand::RngCore;

use super::{
    CenterCrop, ImageTransform, Normalize, RandomCrop, RandomHorizontalFlip, RandomResizedCrop,
    Resize,
};
use crate::{ChwImage, DataError, RgbImage};

/// A chain of image transforms followed by to-float conversion and normalisation.
#[derive(Debug, Default)]
pub struct Pipeline {
    image_transforms: Vec<Box<dyn ImageTransform>>,
    normalize: Option<Normalize>,
}

impl Pipeline {
    /// An empty pipeline: only converts to f32 CHW in [0, 1].
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends an image transform.
    pub fn then(mut self, transform: impl ImageTransform + 'static) -> Self {
        self.image_transforms.push(Box::new(transform));
        self
    }

    /// Sets the normalisation applied after conversion to float.
    pub fn normalized(mut self, normalize: Normalize) -> Self {
        self.normalize = Some(normalize);
        self
    }

    /// Runs every transform on `image` with randomness from `rng`.
    pub fn apply(&self, image: RgbImage, rng: &mut dyn RngCore) -> Result<ChwImage, DataError> {
        let image = self.apply_pixels(image, rng)?;
        let mut tensor = ChwImage::from_rgb(&image);
        if let Some(normalize) = &self.normalize {
            normalize.apply(&mut tensor)?;
        }
        Ok(tensor)
    }

    /// The image transforms alone, the pixels left as bytes: what a loader hands a GPU, which
    /// converts and normalises them itself ([`crate::pixels_to_float`]).
    pub fn apply_pixels(
        &self,
        image: RgbImage,
        rng: &mut dyn RngCore,
    ) -> Result<RgbImage, DataError> {
        let mut image = image;
        for transform in &self.image_transforms {
            image = transform.apply(image, rng)?;
        }
        Ok(image)
    }

    /// The normalisation applied after conversion to float, if any.
    pub fn normalization(&self) -> Option<Normalize> {
        self.normalize
    }

    /// No augmentation: to-float and `normalize` only.
    pub fn none(normalize: Normalize) -> Self {
        Self::new().normalized(normalize)
    }

    /// CIFAR training: random `size` crop with 4 pixels of zero padding,
    /// horizontal flip with p = 0.5, CIFAR-10 normalisation.
    pub fn cifar_train(size: usize) -> Self {
        Self::new()
            .then(RandomCrop { size, padding: 4 })
            .then(RandomHorizontalFlip::default())
            .normalized(Normalize::cifar10())
    }

    /// CIFAR evaluation: CIFAR-10 normalisation only.
    pub fn cifar_eval() -> Self {
        Self::none(Normalize::cifar10())
    }

    /// ImageNet training: `RandomResizedCrop(size)` with default scale and
    /// ratio, horizontal flip with p = 0.5, ImageNet normalisation.
    pub fn imagenet_train(size: usize) -> Self {
        Self::new()
            .then(RandomResizedCrop::new(size))
            .then(RandomHorizontalFlip::default())
            .normalized(Normalize::imagenet())
    }

    /// ImageNet evaluation: resize the shorter side to `size * 256 / 224`,
    /// centre-crop `size`, ImageNet normalisation.
    pub fn imagenet_eval(size: usize) -> Self {
        Self::new()
            .then(Resize {
                shorter_side: size * 256 / 224,
            })
            .then(CenterCrop { size })
            .normalized(Normalize::imagenet())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::augmentation_rng;

    fn constant_image(width: usize, height: usize, value: u8) -> RgbImage {
        RgbImage::new(width, height, vec![value; width * height * 3]).unwrap()
    }

    #[test]
    fn empty_pipeline_is_to_tensor() {
        let image = RgbImage::new(1, 1, vec![0, 51, 255]).unwrap();
        let out = Pipeline::new()
            .apply(image, &mut augmentation_rng(0, 0, 0))
            .unwrap();
        assert_eq!(out.shape(), [3, 1, 1]);
        assert_eq!(out.data, vec![0.0, 0.2, 1.0]);
    }

    #[test]
    fn presets_produce_expected_shapes() {
        let mut rng = augmentation_rng(3, 0, 0);
        let cases = [
            (Pipeline::cifar_train(32), 32, 32, 32),
            (Pipeline::cifar_eval(), 32, 32, 32),
            (Pipeline::imagenet_train(16), 40, 30, 16),
            (Pipeline::imagenet_eval(14), 40, 30, 14),
        ];
        for (pipeline, width, height, side) in cases {
            let out = pipeline
                .apply(constant_image(width, height, 128), &mut rng)
                .unwrap();
            assert_eq!(out.shape(), [3, side, side], "{pipeline:?}");
        }
    }

    #[test]
    fn imagenet_eval_normalizes_a_constant_image_exactly() {
        let out = Pipeline::imagenet_eval(8)
            .apply(constant_image(20, 12, 255), &mut augmentation_rng(0, 0, 0))
            .unwrap();
        let expected = (1.0 - 0.456) / 0.224;
        assert!(out.data[64..128]
            .iter()
            .all(|v| (v - expected).abs() < 1e-5));
    }

    #[test]
    fn same_rng_gives_same_augmentation() {
        let image = RgbImage::new(4, 4, (0..48).collect()).unwrap();
        let pipeline = Pipeline::cifar_train(4);
        let first = pipeline
            .apply(image.clone(), &mut augmentation_rng(1, 2, 3))
            .unwrap();
        let second = pipeline
            .apply(image, &mut augmentation_rng(1, 2, 3))
            .unwrap();
        assert_eq!(first, second);
    }
}
