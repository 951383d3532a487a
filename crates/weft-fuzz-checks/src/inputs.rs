//! Data files: CIFAR-10 records and image files.

use std::path::Path;

use weft_data::{augmentation_rng, decode_rgb_bytes, Cifar10, Dataset, ImageLimits, Pipeline};

/// CIFAR-10 bytes: whatever the checks accept yields every one of its samples, each labelled
/// within the classes, and nothing past them.
pub fn cifar_records(data: &[u8]) {
    if let Ok(dataset) = Cifar10::from_bytes(Path::new("fuzz.bin"), data.to_vec()) {
        for i in 0..dataset.len() {
            let sample = dataset.get(i).expect("an accepted record reads");
            assert!((sample.label as usize) < dataset.num_classes());
        }
        assert!(dataset.get(dataset.len()).is_err());
    }
}

/// An image file's bytes, decoded as a dataset decodes its files (small limits, so that the
/// fuzzer explores refusals): an image is refused with an error or decodes within the limits,
/// and the evaluation transform (resize the shorter side, centre-crop) then gives a 16 × 16
/// image of three channels, never an allocation out of proportion to the input.
pub fn image_decode(data: &[u8]) {
    let limits = ImageLimits {
        max_side: 512,
        max_pixels: 1 << 16,
        max_aspect_ratio: 32,
        max_decode_bytes: 8 << 20,
    };
    let Ok(image) = decode_rgb_bytes(Path::new("fuzz.img"), data, &limits) else {
        return;
    };
    let (long, short) = (
        image.width().max(image.height()),
        image.width().min(image.height()),
    );
    assert!(short > 0 && long <= 512 && (long * short) as u64 <= 1 << 16);
    assert!(
        long <= 32 * short,
        "{long} x {short} passed the aspect-ratio limit"
    );
    let mut rng = augmentation_rng(0, 0, 0);
    let out = Pipeline::imagenet_eval(16)
        .apply(image, &mut rng)
        .expect("a decoded image transforms");
    assert_eq!(out.shape(), [3, 16, 16]);
}
