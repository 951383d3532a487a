//! Parameter initialisation as torchvision does it, from a seeded generator.

use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

/// A seeded source of initial parameter values (reproducible across runs and ranks).
pub struct Init {
    rng: ChaCha8Rng,
}

impl Init {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// Normal(0, std) values of `shape`.
    pub fn normal(
        &mut self,
        shape: &[usize],
        std: f64,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<Tensor> {
        let normal = Normal::new(0.0, std).expect("std is finite and positive");
        let n: usize = shape.iter().product();
        let values: Vec<f64> = (0..n).map(|_| normal.sample(&mut self.rng)).collect();
        Tensor::from_vec(values, shape, device)?.to_dtype(dtype)
    }

    /// Uniform(-bound, bound) values of `shape`.
    pub fn uniform(
        &mut self,
        shape: &[usize],
        bound: f64,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<Tensor> {
        let n: usize = shape.iter().product();
        let values: Vec<f64> = (0..n).map(|_| self.rng.gen_range(-bound..=bound)).collect();
        Tensor::from_vec(values, shape, device)?.to_dtype(dtype)
    }
}
