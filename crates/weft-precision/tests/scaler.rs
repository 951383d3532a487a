//! The dynamic loss scaler against `torch.amp.GradScaler`'s rules: an overflow skips the step
//! and halves the scale, 2000 clean steps double it, a hand-traced sequence of steps gives the
//! hand-computed scales; the found-inf check of the unscaling pass; bad settings refused.

use candle_core::{DType, Device, Tensor};
use weft_precision::{unscale_and_check, DynamicLossScaler, ScalerConfig, StepDecision};

#[test]
fn overflow_skips_and_halves_clean_runs_double() {
    let mut scaler = DynamicLossScaler::new(ScalerConfig::default()).unwrap();
    assert_eq!(scaler.scale(), 65536.0);
    assert_eq!(scaler.update(true), StepDecision::Skip);
    assert_eq!(scaler.scale(), 32768.0);
    for step in 0..1999 {
        assert_eq!(scaler.update(false), StepDecision::Apply, "step {step}");
        assert_eq!(scaler.scale(), 32768.0, "grew early at step {step}");
    }
    assert_eq!(scaler.update(false), StepDecision::Apply);
    assert_eq!(scaler.scale(), 65536.0, "2000 clean steps double it");
    assert_eq!(scaler.state().growth_tracker, 0);
    assert_eq!(scaler.state().skipped_steps, 1);
}

#[test]
fn a_hand_traced_sequence_of_scales() {
    // growth_interval 3: clean steps count up to 3 and double; an overflow halves and resets.
    let mut scaler = DynamicLossScaler::new(ScalerConfig {
        init_scale: 8.0,
        growth_interval: 3,
        ..ScalerConfig::default()
    })
    .unwrap();
    let found_inf = [
        false, false, true, false, false, false, false, true, true, false,
    ];
    let expected = [8.0, 8.0, 4.0, 4.0, 4.0, 8.0, 8.0, 4.0, 2.0, 2.0];
    let scales: Vec<f64> = found_inf
        .iter()
        .map(|&inf| {
            scaler.update(inf);
            scaler.scale()
        })
        .collect();
    assert_eq!(scales, expected);
    assert_eq!(scaler.state().skipped_steps, 3);
    let saved = scaler.state().clone();
    let json = serde_json::to_string(&saved).unwrap();
    let mut restored = DynamicLossScaler::new(ScalerConfig::default()).unwrap();
    restored
        .load_state(serde_json::from_str(&json).unwrap())
        .unwrap();
    assert_eq!(restored.state(), &saved);
}

#[test]
fn unscaling_divides_and_flags_any_inf_or_nan() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let grads = Tensor::new(&[2048f32, -512.0, 0.0, 64.0], &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let found = unscale_and_check(&grads, 0..4, 1.0 / 1024.0).unwrap();
        assert_eq!(found.to_vec1::<f32>().unwrap(), [0.0], "{dtype:?}");
        let values: Vec<f32> = grads.to_dtype(DType::F32).unwrap().to_vec1().unwrap();
        assert_eq!(values, [2.0, -0.5, 0.0, 0.0625], "{dtype:?}");
        for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
            let grads = Tensor::new(&[1f32, bad, 3.0], &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let found = unscale_and_check(&grads, 0..3, 0.5).unwrap();
            assert_eq!(found.to_vec1::<f32>().unwrap(), [1.0], "{dtype:?} {bad}");
            // Outside the range checked, a bad value is not this rank's concern.
            let found = unscale_and_check(&grads, 2..3, 0.5).unwrap();
            assert_eq!(found.to_vec1::<f32>().unwrap(), [0.0], "{dtype:?} {bad}");
        }
    }
}

#[test]
fn bad_settings_are_refused_naming_the_field() {
    let bad = [
        ScalerConfig {
            init_scale: 0.0,
            ..ScalerConfig::default()
        },
        ScalerConfig {
            growth_factor: 1.0,
            ..ScalerConfig::default()
        },
        ScalerConfig {
            backoff_factor: 1.5,
            ..ScalerConfig::default()
        },
        ScalerConfig {
            growth_interval: 0,
            ..ScalerConfig::default()
        },
    ];
    for (config, field) in bad.into_iter().zip([
        "init_scale",
        "growth_factor",
        "backoff_factor",
        "growth_interval",
    ]) {
        let err = DynamicLossScaler::new(config).unwrap_err().to_string();
        assert!(err.contains(field), "{err}");
    }
}
