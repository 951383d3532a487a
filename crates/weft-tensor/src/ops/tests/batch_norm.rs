//! `batch_norm_train` against hand-computed values, finite differences, and the
//! Candle-ops composition with its autograd; `batch_norm_eval` against hand-computed values.

use super::support::{assert_close, autograd, finite_differences, seeded, values};
use crate::ops::batch_norm::batch_norm_train_candle;
use crate::ops::{batch_norm_eval, batch_norm_train, EvalStats};
use candle_core::{DType, Device, Result, Tensor};

/// `x` (2 x 2 x 1 x 2, row-major) normalised by hand with eps 1: channel 0 by mean 4 and
/// variance 5 (so divided by sqrt(6)), weight 2, bias 0.5; channel 1 by mean 3 and variance 3
/// (divided by 2), weight -1, bias 1.
fn normalised_by_hand(x: [f64; 8]) -> Vec<f64> {
    let c0 = |v: f64| (v - 4.) / 6f64.sqrt() * 2. + 0.5;
    let c1 = |v: f64| -(v - 3.) / 2. + 1.;
    x.iter()
        .enumerate()
        .map(|(i, &v)| if (i / 2) % 2 == 0 { c0(v) } else { c1(v) })
        .collect()
}

#[test]
fn forward_matches_hand_computed_values() -> Result<()> {
    // Channel 0 holds 1, 3, 5, 7 (mean 4, biased var 5); channel 1 holds 2, 2, 2, 6
    // (mean 3, biased var 3).
    let x = Tensor::new(
        &[[[[1f64, 3.]], [[2., 2.]]], [[[5., 7.]], [[2., 6.]]]],
        &Device::Cpu,
    )?;
    let weight = Tensor::new(&[2f64, -1.], &Device::Cpu)?;
    let bias = Tensor::new(&[0.5f64, 1.], &Device::Cpu)?;
    let (y, mean, var) = batch_norm_train(&x, &weight, &bias, 1.0)?;
    assert_eq!(values(&mean), [4., 3.]);
    assert_eq!(values(&var), [5., 3.]);
    let expected = normalised_by_hand([1., 3., 2., 2., 5., 7., 2., 6.]);
    assert_close(&values(&y), &expected, 1e-15, "y");
    assert!(
        !mean.track_op() && !var.track_op(),
        "statistics are detached"
    );
    Ok(())
}

fn inputs() -> Vec<Tensor> {
    let weight = (seeded(&[3], 2) + 1.5).expect("shift weight");
    vec![seeded(&[4, 3, 2, 3], 1), weight, seeded(&[3], 3)]
}

#[test]
fn gradients_match_finite_differences() -> Result<()> {
    let f = |t: &[Tensor]| Ok(batch_norm_train(&t[0], &t[1], &t[2], 1e-5)?.0);
    let analytic = autograd(&f, &inputs())?;
    for (which, name) in [(0, "dx"), (1, "dweight"), (2, "dbias")] {
        let numeric = finite_differences(&f, &inputs(), which)?;
        assert_close(&analytic[which], &numeric, 1e-6, name);
    }
    Ok(())
}

#[test]
fn matches_candle_ops_and_their_autograd() -> Result<()> {
    for dtype in [DType::F64, DType::F32] {
        let tol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
        let args: Vec<Tensor> = inputs()
            .iter()
            .map(|t| t.to_dtype(dtype))
            .collect::<Result<_>>()?;
        let ours = batch_norm_train(&args[0], &args[1], &args[2], 1e-5)?;
        let candle = batch_norm_train_candle(&args[0], &args[1], &args[2], 1e-5)?;
        assert_close(&values(&ours.0), &values(&candle.0), tol, "y");
        assert_close(&values(&ours.1), &values(&candle.1), tol, "mean");
        assert_close(&values(&ours.2), &values(&candle.2), tol, "var");
        let ours = autograd(
            &|t| Ok(batch_norm_train(&t[0], &t[1], &t[2], 1e-5)?.0),
            &args,
        )?;
        let candle = autograd(
            &|t| Ok(batch_norm_train_candle(&t[0], &t[1], &t[2], 1e-5)?.0),
            &args,
        )?;
        for (which, name) in [(0, "dx"), (1, "dweight"), (2, "dbias")] {
            assert_close(
                &ours[which],
                &candle[which],
                tol * 10.0,
                &format!("{name} {dtype:?}"),
            );
        }
    }
    Ok(())
}

#[test]
fn bad_parameters_are_errors() {
    let [x, weight, bias] = <[Tensor; 3]>::try_from(inputs()).expect("three inputs");
    assert!(
        batch_norm_train(&x, &seeded(&[4], 5), &bias, 1e-5).is_err(),
        "weight length"
    );
    assert!(
        batch_norm_train(&x, &weight, &bias, -1.0).is_err(),
        "negative eps"
    );
    assert!(
        batch_norm_train(&x.flatten_all().unwrap(), &weight, &bias, 1e-5).is_err(),
        "rank"
    );
}

#[test]
fn evaluation_uses_the_running_statistics() -> Result<()> {
    let x = Tensor::new(
        &[[[[1f64, 3.]], [[2., -2.]]], [[[5., 7.]], [[2., 6.]]]],
        &Device::Cpu,
    )?;
    let t = |v: [f64; 2]| Tensor::new(&v, &Device::Cpu);
    let (mean, var, weight, bias) = (t([4., 3.])?, t([5., 3.])?, t([2., -1.])?, t([0.5, 1.])?);
    let stats = || EvalStats {
        running_mean: &mean,
        running_var: &var,
        weight: &weight,
        bias: &bias,
    };
    let expected = normalised_by_hand([1., 3., 2., -2., 5., 7., 2., 6.]);
    let y = batch_norm_eval(&x, stats(), 1.0, false)?;
    let relu = batch_norm_eval(&x, stats(), 1.0, true)?;
    for ((got, rectified), want) in values(&y).iter().zip(values(&relu)).zip(expected) {
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        assert!(
            (rectified - want.max(0.)).abs() < 1e-12,
            "{rectified} vs {want}"
        );
    }
    let short = t([1., 1.])?.narrow(0, 0, 1)?;
    let bad = EvalStats {
        running_mean: &short,
        ..stats()
    };
    assert!(batch_norm_eval(&x, bad, 1.0, false).is_err());
    Ok(())
}
