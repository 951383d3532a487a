//! The seed documents' reason for fp32 master weights, in 16-bit arithmetic: a weight of
//! 0.9824 receiving an update of 0.0010001 keeps it only where the format's spacing near 1 is
//! fine enough, and small gradients underflow in fp16 unless the loss is scaled.

use half::{bf16, f16};
use weft_precision::{DynamicLossScaler, ScalerConfig};

/// `steps` updates of `delta` applied to `weight` in a format (`round`-trips every result).
fn accumulate(weight: f64, delta: f64, steps: usize, round: impl Fn(f64) -> f64) -> f64 {
    (0..steps).fold(round(weight), |w, _| round(w + round(delta)))
}

fn bf(x: f64) -> f64 {
    bf16::from_f64(x).to_f64()
}

fn hf(x: f64) -> f64 {
    f16::from_f64(x).to_f64()
}

fn f32r(x: f64) -> f64 {
    x as f32 as f64
}

#[test]
fn a_small_update_vanishes_in_bf16_survives_roughly_in_fp16_and_exactly_with_fp32_masters() {
    let (w, d) = (0.9824, 0.0010001);
    // bf16's spacing in [0.5, 1) is 2^-8 ≈ 0.0039: 0.9824 + 0.0010001 rounds back to 0.9824's
    // bf16 value, so the weight never moves.
    assert_eq!(bf(bf(w) + bf(d)), bf(w));
    assert_eq!(accumulate(w, d, 100, bf), bf(w));
    // fp16's spacing there is 2^-11 ≈ 0.00049: the update survives, rounded to 0.0009765625.
    let once = hf(hf(w) + hf(d));
    assert!(once > hf(w));
    assert!(
        (once - hf(w) - 0.0009765625).abs() < 1e-12,
        "{}",
        once - hf(w)
    );
    // ... but an update of 1e-4 is below half its spacing and vanishes.
    assert_eq!(hf(hf(w) + hf(1e-4)), hf(w));
    assert_eq!(accumulate(w, 1e-4, 100, hf), hf(w));
    // fp32 master weights keep every update: 100 steps of 1e-4 move the weight by 0.01.
    let master = accumulate(w, 1e-4, 100, f32r);
    assert!((master - (w + 0.01)).abs() < 1e-5, "{master}");
    let master = accumulate(w, d, 100, f32r);
    assert!((master - (w + 100.0 * d)).abs() < 1e-5, "{master}");
}

#[test]
fn a_tiny_gradient_underflows_in_fp16_unless_the_loss_is_scaled() {
    // fp16's smallest subnormal is 2^-24 ≈ 6e-8: a gradient of 1e-8 flushes to zero.
    assert_eq!(hf(1e-8), 0.0);
    let scaler = DynamicLossScaler::new(ScalerConfig::default()).unwrap();
    // Scaled by 2^16 it is 6.6e-4, a normal fp16 number; unscaled in fp32 it comes back.
    let scaled = hf(1e-8 * scaler.scale());
    assert!(scaled > 0.0);
    let unscaled = f32r(scaled * scaler.inverse_scale());
    assert!((unscaled - 1e-8).abs() / 1e-8 < 1e-3, "{unscaled}");
}
