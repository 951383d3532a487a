//! Rotary position embeddings as Hugging Face's Llama computes them: the inverse frequencies
//! `theta^(-2i/d)` for the pairs (i, i + d/2) of a head (`rotate_half`'s pairing, not
//! interleaved), stretched by Llama 3's scaling where the config has one (its
//! `_compute_llama3_parameters`: wavelengths above `original / low_freq_factor` divided by
//! `factor`, below `original / high_freq_factor` kept, and a smooth blend between), and the
//! cosines and sines of each position's angles, in f64.

use super::config::Llama3Scaling;

/// The `head_dim / 2` inverse frequencies of a head of width `head_dim`.
pub fn inverse_frequencies(
    head_dim: usize,
    theta: f64,
    scaling: Option<&Llama3Scaling>,
) -> Vec<f64> {
    let half = head_dim / 2;
    let base = (0..half).map(|i| theta.powf(-((2 * i) as f64) / head_dim as f64));
    let Some(s) = scaling else {
        return base.collect();
    };
    let original = s.original_max_position_embeddings as f64;
    let (low_wavelength, high_wavelength) =
        (original / s.low_freq_factor, original / s.high_freq_factor);
    base.map(|f| {
        let wavelength = 2.0 * std::f64::consts::PI / f;
        if wavelength < high_wavelength {
            f
        } else if wavelength > low_wavelength {
            f / s.factor
        } else {
            let smooth = (original / wavelength - s.low_freq_factor)
                / (s.high_freq_factor - s.low_freq_factor);
            (1.0 - smooth) * f / s.factor + smooth * f
        }
    })
    .collect()
}

/// The cosines and sines of positions `0..positions`, each a row of `head_dim` values: angle
/// `p · f_i` in columns `i` and `i + head_dim / 2` (so that `x · cos + rotate_half(x) · sin`
/// rotates each pair), as Hugging Face's rotary embedding returns them.
pub fn cos_sin(positions: usize, inverse: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let width = 2 * inverse.len();
    let (mut cos, mut sin) = (
        Vec::with_capacity(positions * width),
        Vec::with_capacity(positions * width),
    );
    for p in 0..positions {
        for _half in 0..2 {
            for f in inverse {
                let angle = p as f64 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
    }
    (cos, sin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::LlamaConfig;

    #[test]
    fn plain_frequencies_are_theta_to_the_minus_two_i_over_d() {
        let f = inverse_frequencies(8, 10_000.0, None);
        let expected = [1.0, 0.1, 0.01, 0.001];
        for (got, want) in f.iter().zip(expected) {
            assert!((got - want).abs() < 1e-15 * want.max(1e-3), "{f:?}");
        }
    }

    /// Llama 3.2 1B's scaling: the high frequencies kept, the low ones divided by 32, the band
    /// between blended, still decreasing from the first pair to the last.
    #[test]
    fn llama3_scaling_keeps_high_divides_low_and_blends_between() {
        let config = LlamaConfig::from_name("llama-3.2-1b").unwrap();
        let s = config.rope_scaling.unwrap();
        let plain = inverse_frequencies(64, config.rope_theta, None);
        let scaled = inverse_frequencies(64, config.rope_theta, Some(&s));
        let wavelength = |f: f64| 2.0 * std::f64::consts::PI / f;
        let (mut kept, mut divided, mut blended) = (0, 0, 0);
        for (&p, &q) in plain.iter().zip(&scaled) {
            if wavelength(p) < 8192.0 / 4.0 {
                assert_eq!(p, q);
                kept += 1;
            } else if wavelength(p) > 8192.0 {
                assert!((q - p / 32.0).abs() <= 1e-18);
                divided += 1;
            } else {
                assert!(q < p && q > p / 32.0, "{p} -> {q}");
                blended += 1;
            }
        }
        assert!(
            kept > 0 && divided > 0 && blended > 0,
            "{kept} {divided} {blended}"
        );
        assert!(scaled.windows(2).all(|w| w[1] < w[0]));
    }

    #[test]
    fn cosines_and_sines_repeat_over_the_two_halves() {
        let f = inverse_frequencies(4, 100.0, None);
        let (cos, sin) = cos_sin(3, &f);
        assert_eq!(cos.len(), 12);
        // Position 2, pair 1: angle 2 · 100^(-1/2) = 0.2, in columns 1 and 3.
        assert!((sin[2 * 4 + 1] - 0.2f64.sin()).abs() < 1e-15);
        assert_eq!(sin[2 * 4 + 1], sin[2 * 4 + 3]);
        assert_eq!(cos[0], 1.0);
    }
}
