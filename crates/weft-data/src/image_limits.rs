//! Bounded image decoding: [`ImageLimits`] on an image's dimensions, checked from the file's
//! header before any pixel is decoded, and the decoder's own memory limits (`image::Limits`)
//! behind them.
//!
//! The dimensions matter beyond the decoded bytes: a 1 × 100000 image decodes to 300 KB, but
//! the evaluation `Resize` to a shorter side of 256 would make it 256 × 25 600 000 (about
//! 20 GB, an abort no error can catch). The aspect-ratio bound is what stops that.

use std::io::{BufRead, Cursor, Seek};
use std::path::Path;

use image::{DynamicImage, ImageDecoder, ImageReader};

use crate::{DataError, RgbImage};

/// Bounds on the images a dataset decodes; an image over any of them is refused, from its
/// header, with [`DataError::ImageTooLarge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Longest allowed side, in pixels (default 16384: above any photograph in ImageNet or
    /// Open Images, and the largest texture side of current GPUs).
    pub max_side: u32,
    /// Most pixels in one image (default 89 478 485, PIL's `MAX_IMAGE_PIXELS`, where it warns
    /// of a decompression bomb: 256 MiB of RGB, 341 MiB decoded as RGBA).
    pub max_pixels: u64,
    /// Largest ratio of the longer side to the shorter (default 32): bounds what a resize of
    /// the shorter side makes of the image (256 × 8192 pixels, 6 MiB, at evaluation's 256).
    pub max_aspect_ratio: u32,
    /// Most bytes the decoder may allocate, the decoded image included (`image::Limits`'s
    /// `max_alloc`; default 512 MiB, the `image` crate's own default).
    pub max_decode_bytes: u64,
}

impl Default for ImageLimits {
    fn default() -> Self {
        Self {
            max_side: 16_384,
            max_pixels: 89_478_485,
            max_aspect_ratio: 32,
            max_decode_bytes: 512 << 20,
        }
    }
}

impl ImageLimits {
    /// `Ok` if a `width` x `height` image at `path` is within the limits.
    pub fn check(&self, path: &Path, width: u32, height: u32) -> Result<(), DataError> {
        let (long, short) = (width.max(height), width.min(height));
        let pixels = u64::from(width) * u64::from(height);
        let reason = if short == 0 {
            "it has no pixels".to_string()
        } else if long > self.max_side {
            format!(
                "its longer side {long} exceeds {} (ImageLimits::max_side)",
                self.max_side
            )
        } else if pixels > self.max_pixels {
            format!(
                "its {pixels} pixels exceed {} (ImageLimits::max_pixels)",
                self.max_pixels
            )
        } else if u64::from(long) > u64::from(self.max_aspect_ratio) * u64::from(short) {
            format!(
                "its aspect ratio {:.1} exceeds {} (ImageLimits::max_aspect_ratio)",
                f64::from(long) / f64::from(short),
                self.max_aspect_ratio
            )
        } else {
            return Ok(());
        };
        Err(DataError::ImageTooLarge {
            path: path.to_path_buf(),
            width,
            height,
            reason,
        })
    }

    /// The decoder's own limits: the sides and the allocations.
    fn decoder_limits(&self) -> image::Limits {
        let mut limits = image::Limits::default();
        limits.max_image_width = Some(self.max_side);
        limits.max_image_height = Some(self.max_side);
        limits.max_alloc = Some(self.max_decode_bytes);
        limits
    }
}

/// Decodes the image at `path` (format sniffed from its contents) into RGB8, after checking
/// the dimensions in its header against `limits`.
pub(crate) fn decode_rgb(path: &Path, limits: &ImageLimits) -> Result<RgbImage, DataError> {
    let reader = ImageReader::open(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    decode(reader, path, limits)
}

/// Decodes the image file's bytes `bytes` (named `origin` in errors; format sniffed from the
/// contents) into RGB8, after checking the dimensions in its header against `limits`, as a
/// dataset decodes a file.
pub fn decode_rgb_bytes(
    origin: &Path,
    bytes: &[u8],
    limits: &ImageLimits,
) -> Result<RgbImage, DataError> {
    decode(ImageReader::new(Cursor::new(bytes)), origin, limits)
}

fn decode<R: BufRead + Seek>(
    reader: ImageReader<R>,
    path: &Path,
    limits: &ImageLimits,
) -> Result<RgbImage, DataError> {
    let io_error = |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    };
    let decode_error = |source| DataError::Decode {
        path: path.to_path_buf(),
        source,
    };
    let mut reader = reader.with_guessed_format().map_err(io_error)?;
    // Reading the header allocates little; the sides are left to `check`, whose error names them.
    let mut header_limits = limits.decoder_limits();
    header_limits.max_image_width = None;
    header_limits.max_image_height = None;
    reader.limits(header_limits);
    let mut decoder = reader.into_decoder().map_err(decode_error)?;
    let (width, height) = decoder.dimensions();
    limits.check(path, width, height)?;
    // As `ImageReader::decode` does: the output buffer counts against the allocation limit.
    let mut decoder_limits = limits.decoder_limits();
    decoder_limits
        .reserve(decoder.total_bytes())
        .map_err(decode_error)?;
    decoder.set_limits(decoder_limits).map_err(decode_error)?;
    let decoded = DynamicImage::from_decoder(decoder).map_err(decode_error)?;
    Ok(RgbImage::from_image_buffer(decoded.into_rgb8()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_images::write_png;

    fn refusal(limits: &ImageLimits, width: u32, height: u32) -> Option<String> {
        let path = Path::new("x.png");
        limits
            .check(path, width, height)
            .err()
            .map(|e| e.to_string())
    }

    #[test]
    fn each_limit_refuses_in_one_line_naming_file_and_dimensions() {
        let limits = ImageLimits::default();
        assert_eq!(refusal(&limits, 16_384, 16_384 / 32), None);
        assert_eq!(refusal(&limits, 4000, 3000), None);
        let cases = [
            (0, 5, "no pixels"),
            (16_385, 1000, "longer side 16385 exceeds 16384"),
            (10_000, 10_000, "100000000 pixels exceed 89478485"),
            (1, 100_000, "longer side 100000"),
            (33, 1, "aspect ratio 33.0 exceeds 32"),
        ];
        for (width, height, reason) in cases {
            let err = refusal(&limits, width, height).unwrap();
            assert!(err.starts_with(&format!("x.png: image {width}x{height} refused")));
            assert!(err.contains(reason) && !err.contains('\n'), "{err}");
        }
        let loose = ImageLimits {
            max_side: 200_000,
            ..limits
        };
        let err = refusal(&loose, 1, 100_000).unwrap();
        assert!(err.contains("aspect ratio 100000.0 exceeds 32"), "{err}");
    }

    /// A PNG whose header says 1 x 100000 but whose pixel data is cut short is refused from the
    /// header: decoding it would have failed with a decode error instead.
    #[test]
    fn oversized_images_are_refused_from_the_header() {
        let dir = tempfile::tempdir().unwrap();
        let whole = dir.path().join("tall.png");
        write_png(&whole, 1, 100_000, [7, 7, 7]);
        let limits = ImageLimits::default();
        let err = decode_rgb(&whole, &limits).unwrap_err();
        assert!(matches!(
            err,
            DataError::ImageTooLarge {
                width: 1,
                height: 100_000,
                ..
            }
        ));
        let cut = dir.path().join("cut.png");
        let bytes = std::fs::read(&whole).unwrap();
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        let err = decode_rgb(&cut, &limits).unwrap_err();
        assert!(matches!(err, DataError::ImageTooLarge { .. }), "{err:?}");
        let loose = ImageLimits {
            max_side: 200_000,
            max_aspect_ratio: 200_000,
            ..limits
        };
        assert!(matches!(
            decode_rgb(&cut, &loose),
            Err(DataError::Decode { .. })
        ));
        assert_eq!(decode_rgb(&whole, &loose).unwrap().height(), 100_000);
    }

    /// The decoder's allocation limit refuses what the dimension checks let through.
    #[test]
    fn the_decoders_allocation_limit_applies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("square.png");
        write_png(&path, 64, 64, [1, 2, 3]);
        let tight = ImageLimits {
            max_decode_bytes: 1000,
            ..ImageLimits::default()
        };
        let err = decode_rgb(&path, &tight).unwrap_err();
        assert!(matches!(err, DataError::Decode { .. }), "{err:?}");
        assert!(err.is_bad_sample());
        let image = decode_rgb(&path, &ImageLimits::default()).unwrap();
        assert_eq!(image.pixel(63, 63), [1, 2, 3]);
    }
}
