//! `relu`, `add_relu` and `batch_norm_relu_train` against hand-computed values, finite
//! differences and the unfused compositions.

use super::support::{assert_close, autograd, finite_differences, seeded, values};
use crate::ops::{add_relu, batch_norm_relu_train, batch_norm_train, relu};
use candle_core::{Device, Result, Tensor, Var};

/// Values away from the kink at zero, where finite differences are exact.
fn away_from_zero(shape: &[usize], seed: u64) -> Tensor {
    let shifted: Vec<f64> = values(&seeded(shape, seed))
        .into_iter()
        .map(|v| if v >= 0.0 { v + 0.1 } else { v - 0.1 })
        .collect();
    Tensor::from_vec(shifted, shape, &Device::Cpu).expect("shape matches")
}

#[test]
fn forward_and_gradient_by_hand_including_zero_and_nan() -> Result<()> {
    let x = Var::new(&[-2f64, -0.0, 0.0, 1.5, f64::NAN, 3.0], &Device::Cpu)?;
    let y = relu(x.as_tensor())?;
    let got = values(&y);
    assert_eq!(&got[..4], &[0.0, 0.0, 0.0, 1.5]);
    assert!(got[4].is_nan(), "NaN stays NaN");
    assert_eq!(got[5], 3.0);
    let dy = Tensor::new(&[1f64, 2., 3., 4., 5., 6.], &Device::Cpu)?;
    let grads = crate::vjp::backward_from(&y, &dy)?;
    // Zero gradient at zero (PyTorch's rule); a NaN output passes the gradient through.
    assert_eq!(
        values(grads.get(x.as_tensor()).expect("x")),
        [0., 0., 0., 4., 5., 6.]
    );
    Ok(())
}

#[test]
fn relu_and_add_relu_match_finite_differences_and_candle() -> Result<()> {
    let (a, b) = (
        away_from_zero(&[2, 3, 4, 5], 1),
        away_from_zero(&[2, 3, 4, 5], 2),
    );
    let f = |t: &[Tensor]| relu(&t[0]);
    assert_close(
        &autograd(&f, std::slice::from_ref(&a))?[0],
        &finite_differences(&f, std::slice::from_ref(&a), 0)?,
        1e-8,
        "relu dx",
    );
    assert_eq!(values(&relu(&a)?), values(&a.relu()?));
    let g = |t: &[Tensor]| add_relu(&t[0], &t[1]);
    let sum = |t: &[Tensor]| (&t[0] + &t[1])?.relu();
    let inputs = [a, (b * 0.5)?];
    assert_close(
        &values(&g(&inputs)?),
        &values(&sum(&inputs)?),
        0.0,
        "add_relu",
    );
    let analytic = autograd(&g, &inputs)?;
    for (which, name) in [(0, "da"), (1, "db")] {
        let numeric = finite_differences(&g, &inputs, which)?;
        assert_close(&analytic[which], &numeric, 1e-7, name);
    }
    Ok(())
}

#[test]
fn add_relu_rejects_different_shapes() {
    let a = seeded(&[2, 3], 1);
    let b = seeded(&[3, 2], 2);
    assert!(add_relu(&a, &b).is_err());
}

#[test]
fn batch_norm_relu_equals_batch_norm_then_relu() -> Result<()> {
    let weight = (seeded(&[3], 2) + 1.5)?;
    let inputs = vec![seeded(&[4, 3, 2, 3], 1), weight, seeded(&[3], 3)];
    let fused = |t: &[Tensor]| Ok(batch_norm_relu_train(&t[0], &t[1], &t[2], 1e-5)?.0);
    let composed = |t: &[Tensor]| relu(&batch_norm_train(&t[0], &t[1], &t[2], 1e-5)?.0);
    assert_close(
        &values(&fused(&inputs)?),
        &values(&composed(&inputs)?),
        1e-15,
        "y",
    );
    let (a, b) = (autograd(&fused, &inputs)?, autograd(&composed, &inputs)?);
    for (which, name) in [(0, "dx"), (1, "dweight"), (2, "dbias")] {
        assert_close(&a[which], &b[which], 1e-12, name);
        let numeric = finite_differences(&fused, &inputs, which)?;
        assert_close(
            &a[which],
            &numeric,
            1e-6,
            &format!("{name} vs finite differences"),
        );
    }
    Ok(())
}
