//! `max_pool2d` against hand-computed values, finite differences, and the Candle-ops
//! fallback.

use super::support::{assert_close, autograd, finite_differences, seeded, values};
use crate::ops::max_pool::max_pool2d_candle;
use crate::ops::max_pool2d;
use candle_core::{Device, Result, Tensor, Var};

fn plane(rows: &[[f64; 4]]) -> Tensor {
    let flat: Vec<f64> = rows.iter().flatten().copied().collect();
    Tensor::from_vec(flat, (1, 1, rows.len(), 4), &Device::Cpu).expect("valid plane")
}

/// Gradient of `sum(max_pool(x) * dy)` w.r.t. `x`.
fn input_grad(x: &Tensor, dy: &Tensor, (k, s, p): (usize, usize, usize)) -> Result<Vec<f64>> {
    let x = Var::from_tensor(x)?;
    let grads = (max_pool2d(x.as_tensor(), k, s, p)? * dy)?
        .sum_all()?
        .backward()?;
    Ok(values(grads.get(x.as_tensor()).expect("x gradient")))
}

#[test]
fn forward_and_backward_match_hand_computed_values() -> Result<()> {
    let x = plane(&[
        [3., 9., 1., 12.],
        [7., 0., 15., 4.],
        [10., 2., 8., 13.],
        [5., 14., 6., 11.],
    ]);
    // 3x3 windows, stride 2, padding 1: rows/cols 0..2 and 1..4 of the input.
    assert_eq!(values(&max_pool2d(&x, 3, 2, 1)?), [9., 15., 14., 15.]);
    let dy = Tensor::new(&[[[[1f64, 2.], [3., 4.]]]], &Device::Cpu)?;
    let expected = [
        0., 1., 0., 0., 0., 0., 6., 0., 0., 0., 0., 0., 0., 3., 0., 0.,
    ];
    assert_eq!(input_grad(&x, &dy, (3, 2, 1))?, expected);
    Ok(())
}

#[test]
fn ties_send_the_gradient_to_the_first_maximum() -> Result<()> {
    let x = plane(&[[5., 5., 1., 0.], [5., 2., 5., 0.], [0., 5., 5., 0.]]).narrow(3, 0, 3)?;
    let dy = Tensor::new(&[[[[1f64, 2.], [3., 4.]]]], &Device::Cpu)?;
    let expected = [1., 2., 0., 3., 0., 4., 0., 0., 0.];
    assert_eq!(input_grad(&x, &dy, (2, 1, 0))?, expected, "custom op");
    let x = Var::from_tensor(&x)?;
    let grads = (max_pool2d_candle(x.as_tensor(), 2, 1, 0)? * &dy)?
        .sum_all()?
        .backward()?;
    assert_eq!(
        values(grads.get(x.as_tensor()).expect("x gradient")),
        expected,
        "fallback"
    );
    Ok(())
}

#[test]
fn a_nan_in_a_window_pools_to_nan() -> Result<()> {
    let x = plane(&[[1., f64::NAN, 3., 4.], [5., 6., 7., 8.]]);
    let y = values(&max_pool2d(&x, 2, 2, 0)?);
    assert!(y[0].is_nan(), "window with NaN gives {}", y[0]);
    assert_eq!(y[1], 8.);
    Ok(())
}

/// (kernel, stride, padding) cases: ResNet's stem pool, tiling windows, overlapping ones.
const CASES: &[(usize, usize, usize)] = &[(3, 2, 1), (2, 2, 0), (3, 1, 1), (2, 1, 0), (3, 3, 0)];

#[test]
fn gradients_match_finite_differences() -> Result<()> {
    for (case, &(k, s, p)) in CASES.iter().enumerate() {
        let x = seeded(&[2, 3, 7, 6], case as u64);
        let f = |t: &[Tensor]| max_pool2d(&t[0], k, s, p);
        let analytic = autograd(&f, std::slice::from_ref(&x))?;
        let numeric = finite_differences(&f, &[x], 0)?;
        assert_close(&analytic[0], &numeric, 1e-6, &format!("k{k} s{s} p{p}"));
    }
    Ok(())
}

#[test]
fn custom_op_matches_candle_fallback() -> Result<()> {
    for (case, &(k, s, p)) in CASES.iter().enumerate() {
        let x = seeded(&[2, 2, 8, 7], 100 + case as u64);
        for dtype in [candle_core::DType::F32, candle_core::DType::F64] {
            let x = x.to_dtype(dtype)?;
            let ours = max_pool2d(&x, k, s, p)?;
            let fallback = max_pool2d_candle(&x, k, s, p)?;
            assert_eq!(
                values(&ours),
                values(&fallback),
                "forward k{k} s{s} p{p} {dtype:?}"
            );
        }
        let ours = autograd(&|t| max_pool2d(&t[0], k, s, p), std::slice::from_ref(&x))?;
        let fallback = autograd(&|t| max_pool2d_candle(&t[0], k, s, p), &[x])?;
        assert_eq!(ours, fallback, "backward k{k} s{s} p{p}");
    }
    Ok(())
}

#[test]
fn bad_windows_are_errors() {
    let x = seeded(&[1, 1, 4, 4], 7);
    assert!(
        max_pool2d(&x, 3, 2, 2).is_err(),
        "padding above half the kernel"
    );
    assert!(max_pool2d(&x, 5, 1, 0).is_err(), "kernel larger than input");
    assert!(max_pool2d(&x, 2, 0, 0).is_err(), "zero stride");
}
