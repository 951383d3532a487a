//! Owned image buffers: `RgbImage` (8-bit RGB, HWC) as produced by datasets,
//! and `ChwImage` (f32, CHW) as produced by a transform pipeline.

use crate::DataError;

/// An owned 8-bit RGB image in row-major HWC layout (`data[(y * width + x) * 3 + c]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    width: usize,
    height: usize,
    data: Vec<u8>,
}

impl RgbImage {
    /// Wraps `data` (length `width * height * 3`, HWC) as an image.
    pub fn new(width: usize, height: usize, data: Vec<u8>) -> Result<Self, DataError> {
        let expected = width.checked_mul(height).and_then(|n| n.checked_mul(3));
        if expected != Some(data.len()) {
            return Err(DataError::InvalidConfig {
                field: "RgbImage data",
                reason: format!(
                    "{} bytes given for a {width}x{height} RGB image (expected width*height*3)",
                    data.len()
                ),
            });
        }
        Ok(Self {
            width,
            height,
            data,
        })
    }

    /// An all-black image.
    pub fn black(width: usize, height: usize) -> Self {
        Self {
            width,
            height,
            data: vec![0; width * height * 3],
        }
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn height(&self) -> usize {
        self.height
    }

    /// The raw HWC bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    pub fn into_data(self) -> Vec<u8> {
        self.data
    }

    /// The pixel at column `x`, row `y`; panics if out of bounds (like slice indexing).
    pub fn pixel(&self, x: usize, y: usize) -> [u8; 3] {
        assert!(
            x < self.width && y < self.height,
            "pixel ({x}, {y}) out of bounds"
        );
        let offset = (y * self.width + x) * 3;
        [
            self.data[offset],
            self.data[offset + 1],
            self.data[offset + 2],
        ]
    }

    /// Sets the pixel at column `x`, row `y`; panics if out of bounds.
    pub fn set_pixel(&mut self, x: usize, y: usize, rgb: [u8; 3]) {
        assert!(
            x < self.width && y < self.height,
            "pixel ({x}, {y}) out of bounds"
        );
        let offset = (y * self.width + x) * 3;
        self.data[offset..offset + 3].copy_from_slice(&rgb);
    }

    /// Converts an `image` crate buffer (already RGB8) without copying.
    pub fn from_image_buffer(buffer: image::RgbImage) -> Self {
        let (width, height) = buffer.dimensions();
        Self {
            width: width as usize,
            height: height as usize,
            data: buffer.into_raw(),
        }
    }

    /// Converts into an `image` crate buffer without copying (for resizing).
    pub fn into_image_buffer(self) -> image::RgbImage {
        let (width, height) = (self.width as u32, self.height as u32);
        image::RgbImage::from_raw(width, height, self.data)
            .expect("RgbImage invariant: data.len() == width * height * 3")
    }
}

/// A float image in CHW layout (`data[(c * height + y) * width + x]`).
#[derive(Debug, Clone, PartialEq)]
pub struct ChwImage {
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    pub data: Vec<f32>,
}

impl ChwImage {
    /// `[channels, height, width]`.
    pub fn shape(&self) -> [usize; 3] {
        [self.channels, self.height, self.width]
    }

    /// The value of channel `c` at column `x`, row `y`.
    pub fn at(&self, c: usize, y: usize, x: usize) -> f32 {
        self.data[(c * self.height + y) * self.width + x]
    }

    /// Converts an 8-bit HWC image to floats in [0, 1], CHW (like torchvision's `ToTensor`).
    pub fn from_rgb(image: &RgbImage) -> Self {
        let (width, height) = (image.width(), image.height());
        let plane = width * height;
        let mut data = vec![0.0f32; 3 * plane];
        for (pixel_index, rgb) in image.data().chunks_exact(3).enumerate() {
            for (c, &value) in rgb.iter().enumerate() {
                data[c * plane + pixel_index] = f32::from(value) / 255.0;
            }
        }
        Self {
            channels: 3,
            height,
            width,
            data,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_rejects_wrong_length() {
        let err = RgbImage::new(2, 2, vec![0; 11]).unwrap_err();
        assert!(err.to_string().contains("11 bytes"), "{err}");
    }

    #[test]
    fn pixel_roundtrip_and_chw_layout() {
        let mut image = RgbImage::black(2, 1);
        image.set_pixel(1, 0, [255, 51, 0]);
        assert_eq!(image.pixel(1, 0), [255, 51, 0]);
        let chw = ChwImage::from_rgb(&image);
        assert_eq!(chw.shape(), [3, 1, 2]);
        assert_eq!(chw.data, vec![0.0, 1.0, 0.0, 0.2, 0.0, 0.0]);
    }

    #[test]
    fn image_buffer_roundtrip() {
        let image = RgbImage::new(1, 2, vec![1, 2, 3, 4, 5, 6]).unwrap();
        let buffer = image.clone().into_image_buffer();
        assert_eq!(buffer.get_pixel(0, 1).0, [4, 5, 6]);
        assert_eq!(RgbImage::from_image_buffer(buffer), image);
    }
}
