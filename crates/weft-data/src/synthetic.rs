//! `SyntheticShapes`: a procedurally generated, learnable image-classification
//! dataset. Each class is a shape (see `SHAPE_NAMES`) drawn at a random
//! position and size, in a random foreground colour on a random background
//! colour, plus per-pixel noise. Sample `i` is a pure function of
//! `(seed, i)`, so any index can be generated on any thread in any order.
//!
//! Difficulty check (default config, 20 000 training samples): a 3-stage
//! ResNet with 16/32/64 channels reaches ~87% validation accuracy after one
//! epoch and >99% after two.

use rand::{Rng, RngCore};

use crate::dataset::check_index;
use crate::seeding::{rng_from_words, SYNTHETIC_DOMAIN};
use crate::shapes::{covers, Placement, SHAPE_NAMES};
use crate::{DataError, Dataset, RgbImage, Sample};

/// Xor-ed into the seed by `SyntheticShapes::validation`, so a
/// validation set never repeats the training samples of the same seed.
pub const VALIDATION_SEED_SALT: u64 = 0x5641_4c49_4441_5445; // "VALIDATE"

/// Smallest supported `image_size`.
const MIN_IMAGE_SIZE: usize = 8;

/// Parameters of a `SyntheticShapes` dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticConfig {
    pub num_samples: usize,
    /// Between 1 and 10 (`SHAPE_NAMES.len()`); label `k` is shape `SHAPE_NAMES[k]`.
    pub num_classes: usize,
    /// Side of the square images, at least 8 pixels.
    pub image_size: usize,
    pub seed: u64,
    /// Per-pixel noise amplitude as a fraction of the 0..=255 range, in [0, 1]:
    /// each channel gets a uniform offset in `[-noise * 255, noise * 255]`, one of 256
    /// evenly spaced values (one random byte each).
    pub noise: f32,
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        Self {
            num_samples: 10_000,
            num_classes: 10,
            image_size: 32,
            seed: 0,
            noise: 0.1,
        }
    }
}

/// The synthetic shapes dataset.
#[derive(Debug, Clone)]
pub struct SyntheticShapes {
    config: SyntheticConfig,
}

impl SyntheticShapes {
    /// Validates `config` and builds the dataset (no samples are generated up front).
    pub fn new(config: SyntheticConfig) -> Result<Self, DataError> {
        if !(1..=SHAPE_NAMES.len()).contains(&config.num_classes) {
            return Err(DataError::InvalidConfig {
                field: "SyntheticConfig::num_classes",
                reason: format!(
                    "{} is not between 1 and {}",
                    config.num_classes,
                    SHAPE_NAMES.len()
                ),
            });
        }
        if config.image_size < MIN_IMAGE_SIZE {
            return Err(DataError::InvalidConfig {
                field: "SyntheticConfig::image_size",
                reason: format!(
                    "{} is below the minimum of {MIN_IMAGE_SIZE}",
                    config.image_size
                ),
            });
        }
        if !(0.0..=1.0).contains(&config.noise) {
            return Err(DataError::InvalidConfig {
                field: "SyntheticConfig::noise",
                reason: format!("{} is not in [0, 1]", config.noise),
            });
        }
        Ok(Self { config })
    }

    /// A training set of `num_samples` 32x32 images of 10 classes, generated from `seed`.
    pub fn train(num_samples: usize, seed: u64) -> Self {
        Self {
            config: SyntheticConfig {
                num_samples,
                seed,
                ..SyntheticConfig::default()
            },
        }
    }

    /// The validation counterpart of `train(_, seed)`: same distribution,
    /// generated from `seed ^ VALIDATION_SEED_SALT` so it holds different samples.
    pub fn validation(num_samples: usize, seed: u64) -> Self {
        Self::train(num_samples, seed ^ VALIDATION_SEED_SALT)
    }

    pub fn config(&self) -> &SyntheticConfig {
        &self.config
    }

    /// Draws sample `index`; all randomness comes from the `(seed, index)` stream.
    fn render(&self, index: usize) -> Sample {
        let size = self.config.image_size;
        let side = size as f32;
        let mut rng = rng_from_words([self.config.seed, index as u64, SYNTHETIC_DOMAIN, 0]);
        let label = rng.gen_range(0..self.config.num_classes);

        let margin = 0.04 * side;
        let box_size = rng.gen_range(0.35..=0.9) * side;
        let max_corner = side - box_size - margin;
        let placement = Placement {
            left: rng.gen_range(margin..=max_corner),
            top: rng.gen_range(margin..=max_corner),
            size: box_size,
            mirrored: rng.gen_bool(0.5),
        };
        let (foreground, background) = contrasting_colours(&mut rng);
        let [foreground, background] = [foreground, background]
            .map(|colour| colour.map(|channel| noisy_values(channel, self.config.noise * 255.0)));

        // One random byte per channel, turned into the noisy value by a table: generating
        // samples as fast as a GPU consumes them (a 224 px image is 150 KB of noise).
        let mut data = vec![0u8; size * size * 3];
        rng.fill_bytes(&mut data);
        for (y, row) in data.chunks_exact_mut(size * 3).enumerate() {
            for (x, pixel) in row.chunks_exact_mut(3).enumerate() {
                let colour = match covers(label, &placement, x, y) {
                    true => &foreground,
                    false => &background,
                };
                for (value, table) in pixel.iter_mut().zip(colour) {
                    *value = table[usize::from(*value)];
                }
            }
        }
        Sample {
            image: RgbImage::new(size, size, data).expect("size x size x 3 bytes"),
            label: label as u32,
        }
    }
}

/// The 256 noisy values of a channel of value `channel`, indexed by a random byte `b`: the
/// offset `-amplitude + 2 amplitude b / 255` added, rounded (ties to even, so that the two
/// ends of the range round alike) and clamped to 0..=255.
fn noisy_values(channel: u8, amplitude: f32) -> [u8; 256] {
    std::array::from_fn(|b| {
        let offset = -amplitude + 2.0 * amplitude * b as f32 / 255.0;
        (f32::from(channel) + offset)
            .round_ties_even()
            .clamp(0.0, 255.0) as u8
    })
}

/// Smallest mean absolute per-channel difference between foreground and background.
const MIN_COLOUR_CONTRAST: u32 = 64;

/// A random foreground and background colour whose channels differ by at
/// least `MIN_COLOUR_CONTRAST` on average. Rejection-samples the background a
/// bounded number of times, then falls back to shifting every channel by 128.
fn contrasting_colours(rng: &mut impl Rng) -> ([u8; 3], [u8; 3]) {
    let foreground: [u8; 3] = rng.gen();
    let contrast = |background: &[u8; 3]| -> u32 {
        let total: u32 = foreground
            .iter()
            .zip(background)
            .map(|(&f, &b)| u32::from(f.abs_diff(b)))
            .sum();
        total / 3
    };
    for _ in 0..64 {
        let background: [u8; 3] = rng.gen();
        if contrast(&background) >= MIN_COLOUR_CONTRAST {
            return (foreground, background);
        }
    }
    (foreground, foreground.map(|c| c.wrapping_add(128)))
}

impl Dataset for SyntheticShapes {
    fn len(&self) -> usize {
        self.config.num_samples
    }

    fn get(&self, index: usize) -> Result<Sample, DataError> {
        check_index(index, self.len())?;
        Ok(self.render(index))
    }

    fn num_classes(&self) -> usize {
        self.config.num_classes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_and_index_give_identical_samples_in_any_order() {
        let data = SyntheticShapes::train(100, 7);
        let forward: Vec<Sample> = (0..100).map(|i| data.get(i).unwrap()).collect();
        for i in (0..100).rev() {
            assert_eq!(data.get(i).unwrap(), forward[i]);
        }
        assert_eq!(SyntheticShapes::train(50, 7).get(42).unwrap(), forward[42]);
    }

    #[test]
    fn different_seeds_and_splits_differ() {
        let a = SyntheticShapes::train(10, 1).get(3).unwrap();
        let b = SyntheticShapes::train(10, 2).get(3).unwrap();
        let c = SyntheticShapes::validation(10, 1).get(3).unwrap();
        assert_ne!(a.image, b.image);
        assert_ne!(a.image, c.image);
    }

    #[test]
    fn classes_are_roughly_balanced() {
        let data = SyntheticShapes::train(2000, 3);
        let mut counts = [0usize; 10];
        for i in 0..data.len() {
            counts[data.get(i).unwrap().label as usize] += 1;
        }
        assert!(
            counts.iter().all(|&n| (140..=260).contains(&n)),
            "{counts:?}"
        );
    }

    #[test]
    fn noiseless_image_has_exactly_two_colours_and_respects_size() {
        let data = SyntheticShapes::new(SyntheticConfig {
            num_samples: 20,
            image_size: 24,
            noise: 0.0,
            ..SyntheticConfig::default()
        })
        .unwrap();
        for i in 0..20 {
            let image = data.get(i).unwrap().image;
            assert_eq!((image.width(), image.height()), (24, 24));
            let mut colours: Vec<[u8; 3]> =
                image.data().chunks(3).map(|p| [p[0], p[1], p[2]]).collect();
            colours.sort();
            colours.dedup();
            assert_eq!(colours.len(), 2, "sample {i}");
            let total_gap: u32 = colours[0]
                .iter()
                .zip(colours[1])
                .map(|(&a, b)| u32::from(a.abs_diff(b)))
                .sum();
            assert!(
                total_gap / 3 >= MIN_COLOUR_CONTRAST,
                "sample {i}: {colours:?}"
            );
        }
    }

    /// The table's offsets run evenly from -amplitude to +amplitude (rounded), clamped at the
    /// range's ends; and a noisy image's pixels of one colour spread over that whole range
    /// with a mean offset near 0.
    #[test]
    fn noise_spans_its_amplitude_evenly() {
        let table = noisy_values(100, 25.5);
        assert_eq!((table[0], table[255]), (74, 126));
        assert!(table.windows(2).all(|w| w[0] <= w[1] && w[1] - w[0] <= 1));
        assert_eq!(noisy_values(250, 25.5)[255], 255, "clamped");
        assert_eq!(noisy_values(3, 25.5)[0], 0, "clamped");

        let noisy = SyntheticShapes::new(SyntheticConfig {
            num_samples: 1,
            image_size: 64,
            ..SyntheticConfig::default()
        })
        .unwrap();
        let clean = SyntheticShapes::new(SyntheticConfig {
            noise: 0.0,
            ..noisy.config().clone()
        })
        .unwrap();
        let (noisy, clean) = (noisy.get(0).unwrap().image, clean.get(0).unwrap().image);
        let offsets: Vec<i32> = noisy
            .data()
            .iter()
            .zip(clean.data())
            .filter(|(_, &c)| (26..=229).contains(&c))
            .map(|(&n, &c)| i32::from(n) - i32::from(c))
            .collect();
        assert!(offsets.len() > 1000);
        let (low, high) = (offsets.iter().min(), offsets.iter().max());
        assert_eq!((low, high), (Some(&-26), Some(&26)), "the noise's range");
        let mean = offsets.iter().sum::<i32>() as f64 / offsets.len() as f64;
        assert!(mean.abs() < 1.0, "mean offset {mean}");
    }

    #[test]
    fn invalid_configs_and_indices_are_errors() {
        let bad_classes = SyntheticConfig {
            num_classes: 11,
            ..SyntheticConfig::default()
        };
        let err = SyntheticShapes::new(bad_classes).unwrap_err().to_string();
        assert!(err.contains("num_classes"), "{err}");
        let bad_noise = SyntheticConfig {
            noise: 1.5,
            ..SyntheticConfig::default()
        };
        assert!(SyntheticShapes::new(bad_noise).is_err());
        let err = SyntheticShapes::train(5, 0).get(5).unwrap_err();
        assert!(matches!(
            err,
            DataError::IndexOutOfRange { index: 5, len: 5 }
        ));
    }
}
