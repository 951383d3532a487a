//! Dropout whose mask is a function of a seed and of each element's place, not of a
//! generator's state (Megatron's RNG tracker, made stateless): element `i` of the logical tensor
//! is kept when `hash(seed, i)`, read as a uniform number in [0, 1), is at least `p`.
//!
//! That makes masks reproducible wherever the same element is computed: a checkpointed block
//! recomputed in backward draws the masks of its forward; the ranks of a tensor-parallel group
//! draw identical masks over replicated activations (same seed, same places) and disjoint parts
//! of one mask over split ones ([`Placement`] puts a rank's slice — its attention heads — at its
//! place in the whole tensor), so a split model drops exactly what the whole model drops.
//!
//! A mask's seed mixes the site's seed ([`Dropout::seed`]: the block, the site, the micro-batch)
//! with the step's value. On a GPU (f32, bf16, f16) the mask is drawn by a kernel on the device,
//! which reads the step's value from device memory ([`set_dropout_step`], written by the
//! trainer before each step or CUDA-graph replay), so a replayed step draws that step's masks;
//! elsewhere it is drawn on the host (in parallel) from [`Dropout::step`], the same value. The
//! kept values are scaled in f32 and rounded once: the device and the host agree bit for bit.

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use crate::error::{Result, TensorError};

/// Where a tensor sits in the logical tensor its mask is drawn over: its dimension `axis` holds
/// indices `offset..offset + len` of that tensor's `total` (the other dimensions are whole).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub axis: usize,
    pub offset: usize,
    pub total: usize,
}

/// One dropout: probability `p` of dropping an element, the site's `seed`, the step's value
/// (the host's copy of what [`set_dropout_step`] writes on a GPU), and where the tensor sits in
/// the logical one (`None`: it is the whole of it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    pub p: f64,
    pub seed: u64,
    pub step: u64,
    pub placement: Option<Placement>,
}

/// Writes `step` as `device`'s dropout step value, stream-ordered before the work queued after
/// it: call it before each training step (eagerly run or replayed from a CUDA graph) with the
/// value the step's [`Dropout::step`] carries. Nothing on the CPU (the host reads
/// [`Dropout::step`]).
pub fn set_dropout_step(device: &Device, step: u64) -> candle_core::Result<()> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        return super::dropout_cuda::set_step(cuda, step);
    }
    let _ = (device, step);
    Ok(())
}

/// Where a tensor's elements sit in the logical tensor: `inner` elements after the placed
/// dimension, which holds `len` of the logical `total` from `offset`.
pub(crate) struct Place {
    pub inner: usize,
    pub len: usize,
    pub total: usize,
    pub offset: usize,
}

/// The [`Place`] of a tensor of `dims` placed as `dropout` says; a bad probability or
/// placement is an error.
pub(crate) fn place(dims: &[usize], dropout: &Dropout) -> Result<Place> {
    let Dropout { p, placement, .. } = *dropout;
    if !(0.0..1.0).contains(&p) {
        return Err(TensorError::Block {
            block: "dropout".into(),
            message: format!("probability {p} is not in [0, 1)"),
        });
    }
    let (axis, offset, total) = match placement {
        Some(pl) => (pl.axis, pl.offset, pl.total),
        None => (0, 0, dims.first().copied().unwrap_or(1)),
    };
    let len = dims.get(axis).copied().unwrap_or(1);
    if axis >= dims.len().max(1) || offset + len > total {
        return Err(TensorError::Block {
            block: "dropout".into(),
            message: format!(
                "a slice {offset}..{} of {total} along dimension {axis} of {dims:?}",
                offset + len
            ),
        });
    }
    let inner = dims.iter().skip(axis + 1).product();
    Ok(Place {
        inner,
        len,
        total,
        offset,
    })
}

/// SplitMix64's finaliser: a bijection of u64 whose outputs pass as independent uniform bits.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seed derived from `seed` and `part` (a step, a micro-batch, a block, a site …).
pub fn derive_seed(seed: u64, part: u64) -> u64 {
    mix64(seed ^ mix64(part))
}

/// A seed part from a name (FNV-1a), e.g. a block's.
pub fn name_seed(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Whether the element at logical index `index` is kept.
fn kept(seed: u64, index: u64, p: f64) -> bool {
    let uniform = (mix64(seed ^ mix64(index)) >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    uniform >= p
}

/// The scaled keep mask (`1 / (1 − p)` or 0) of a tensor of `dims` placed as `dropout` says,
/// its seed mixed with the step's value.
pub fn keep_mask(dims: &[usize], dropout: &Dropout) -> Result<Vec<f32>> {
    let Place {
        inner,
        len,
        total,
        offset,
    } = place(dims, dropout)?;
    let (p, seed) = (dropout.p, derive_seed(dropout.seed, dropout.step));
    let n: usize = dims.iter().product();
    let scale = (1.0 / (1.0 - p)) as f32;
    let mut mask = vec![0f32; n];
    mask.par_chunks_mut(inner.max(1))
        .enumerate()
        .for_each(|(row, values)| {
            // Row `row` = (outer o, axis index a); its place in the logical tensor.
            let (o, a) = (row / len, row % len);
            let base = ((o * total + offset + a) * inner) as u64;
            for (j, v) in values.iter_mut().enumerate() {
                if kept(seed, base + j as u64, p) {
                    *v = scale;
                }
            }
        });
    Ok(mask)
}

/// `x` with its elements dropped as `dropout` says and the kept ones scaled by `1 / (1 − p)`
/// (inverted dropout, the product in f32 for 16-bit values, rounded once); differentiable (the
/// gradient is the same dropout).
pub fn dropout(x: &Tensor, dropout: &Dropout) -> Result<Tensor> {
    if dropout.p == 0.0 {
        return Ok(x.clone());
    }
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() && super::dropout_cuda::has_kernel(x.dtype()) {
        return Ok(super::dropout_cuda::apply(x, dropout)?);
    }
    let mask = keep_mask(x.dims(), dropout)?;
    let mask = Tensor::from_vec(mask, x.shape(), &Device::Cpu)?.to_device(x.device())?;
    Ok(match x.dtype() {
        DType::BF16 | DType::F16 => x.to_dtype(DType::F32)?.mul(&mask)?.to_dtype(x.dtype())?,
        other => x.mul(&mask.to_dtype(other)?)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(p: f64, seed: u64) -> Dropout {
        Dropout {
            p,
            seed,
            step: 5,
            placement: None,
        }
    }

    /// The kept share is 1 − p within a few standard deviations (a fixed seed: no flakiness),
    /// kept values are scaled, and the mask depends on the seed only through the hash.
    #[test]
    fn keeps_one_minus_p_scaled() {
        let dims = [64, 1000];
        let mask = keep_mask(&dims, &whole(0.25, 7)).unwrap();
        let kept = mask.iter().filter(|&&v| v > 0.0).count() as f64 / mask.len() as f64;
        // Binomial standard deviation sqrt(p(1-p)/n) = 0.0017: 5 of them.
        assert!((kept - 0.75).abs() < 0.009, "{kept}");
        assert!(mask
            .iter()
            .all(|&v| v == 0.0 || (v - 4.0 / 3.0).abs() < 1e-6));
        assert_eq!(mask, keep_mask(&dims, &whole(0.25, 7)).unwrap());
        assert_ne!(mask, keep_mask(&dims, &whole(0.25, 8)).unwrap());
        let next_step = Dropout {
            step: 6,
            ..whole(0.25, 7)
        };
        assert_ne!(mask, keep_mask(&dims, &next_step).unwrap());
    }

    /// A slice's mask (heads 2..4 of 6 along dimension 1) is exactly that slice of the whole
    /// tensor's mask: what makes split attention drop what the whole model drops.
    #[test]
    fn a_slice_draws_its_part_of_the_whole_mask() {
        let whole_dims = [2, 6, 3, 5];
        let full = keep_mask(&whole_dims, &whole(0.5, 3)).unwrap();
        let full = Tensor::from_vec(full, &whole_dims, &Device::Cpu).unwrap();
        let part = keep_mask(
            &[2, 2, 3, 5],
            &Dropout {
                p: 0.5,
                seed: 3,
                step: 5,
                placement: Some(Placement {
                    axis: 1,
                    offset: 2,
                    total: 6,
                }),
            },
        )
        .unwrap();
        let expected = full.narrow(1, 2, 2).unwrap().flatten_all().unwrap();
        assert_eq!(part, expected.to_vec1::<f32>().unwrap());
    }

    /// The gradient of dropout is its mask; a bad probability or placement is an error.
    #[test]
    fn gradient_is_the_mask_and_bad_input_is_refused() {
        let x = candle_core::Var::new(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], &Device::Cpu).unwrap();
        let d = whole(0.5, 11);
        let y = dropout(x.as_tensor(), &d).unwrap();
        let grads = y.sum_all().unwrap().backward().unwrap();
        let g = grads.get(x.as_tensor()).unwrap().to_vec1::<f64>().unwrap();
        let mask = keep_mask(&[6], &d).unwrap();
        assert_eq!(g, mask.iter().map(|&m| f64::from(m)).collect::<Vec<_>>());
        assert!(keep_mask(&[4], &whole(1.0, 0)).is_err());
        let outside = Dropout {
            p: 0.1,
            seed: 0,
            step: 0,
            placement: Some(Placement {
                axis: 0,
                offset: 3,
                total: 4,
            }),
        };
        let err = keep_mask(&[2], &outside).unwrap_err().to_string();
        assert!(err.contains("3..5 of 4"), "{err}");
    }
}
