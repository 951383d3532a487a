//! `conv2d` against Candle's convolution, its autograd, and finite differences.

use super::support::{assert_close, autograd, finite_differences, seeded, values, weighted_sum};
use crate::ops::{conv2d, conv2d_backward, conv2d_backward_add, conv2d_forward, ConvOperands};
use candle_core::{DType, Result, Tensor, Var};

/// (x shape, w shape, stride, padding) cases: ResNet's kinds of convolutions, a
/// rectangular kernel, batches large enough to put several images in one GEMM, and
/// images wide enough to be split into bands of output rows, a non-square input, and
/// (last) maps so small that some taps meet only padding (cropped kernels: 3×3 over 1×1,
/// 3×3 with stride 2 over 2×2).
const CASES: &[([usize; 4], [usize; 4], usize, usize)] = &[
    ([2, 3, 6, 6], [4, 3, 3, 3], 1, 1),
    ([2, 3, 7, 7], [4, 3, 3, 3], 2, 1),
    ([6, 2, 5, 5], [3, 2, 3, 3], 1, 0),
    ([2, 3, 6, 6], [5, 3, 1, 1], 2, 0),
    ([6, 4, 3, 3], [2, 4, 1, 1], 1, 0),
    ([1, 2, 9, 9], [3, 2, 7, 7], 2, 3),
    ([5, 2, 6, 6], [3, 2, 3, 2], 2, 1),
    ([1, 3, 4, 4], [2, 3, 3, 3], 1, 1),
    ([2, 2, 24, 24], [3, 2, 3, 3], 1, 1),
    ([1, 2, 40, 40], [3, 2, 3, 3], 2, 1),
    ([2, 3, 20, 20], [2, 3, 1, 1], 1, 0),
    ([2, 3, 7, 6], [4, 3, 3, 3], 2, 1),
    ([3, 4, 1, 1], [5, 4, 3, 3], 1, 1),
    ([3, 4, 2, 2], [5, 4, 3, 3], 2, 1),
];

fn inputs(case: usize) -> (Tensor, Tensor, usize, usize) {
    let (x_shape, w_shape, stride, padding) = CASES[case];
    let seed = case as u64 * 2;
    (
        seeded(&x_shape, seed),
        seeded(&w_shape, seed + 1),
        stride,
        padding,
    )
}

#[test]
fn forward_matches_candle_in_f32_and_f64() -> Result<()> {
    for case in 0..CASES.len() {
        let (x, w, stride, padding) = inputs(case);
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let (x, w) = (x.to_dtype(dtype)?, w.to_dtype(dtype)?);
            let ours = conv2d(&x, &w, stride, padding)?;
            let candle = x.conv2d(&w, padding, stride, 1, 1)?;
            assert_eq!(ours.dims(), candle.dims(), "case {case}");
            assert_close(
                &values(&ours),
                &values(&candle),
                tol,
                &format!("case {case} {dtype:?}"),
            );
        }
    }
    Ok(())
}

#[test]
fn forward_accepts_non_contiguous_input() -> Result<()> {
    let x = seeded(&[2, 3, 5, 6], 40).transpose(2, 3)?;
    let w = seeded(&[4, 3, 3, 3], 41);
    let ours = conv2d(&x, &w, 2, 1)?;
    let candle = x.contiguous()?.conv2d(&w, 1, 2, 1, 1)?;
    assert_close(&values(&ours), &values(&candle), 1e-12, "transposed x");
    Ok(())
}

#[test]
fn gradients_match_finite_differences() -> Result<()> {
    for case in [0, 1, 3, 5, 6, 11, 12, 13] {
        let (x, w, stride, padding) = inputs(case);
        let f = |t: &[Tensor]| conv2d(&t[0], &t[1], stride, padding);
        let grads = autograd(&f, &[x.clone(), w.clone()])?;
        for (which, name) in [(0, "dx"), (1, "dw")] {
            let numeric = finite_differences(&f, &[x.clone(), w.clone()], which)?;
            assert_close(
                &grads[which],
                &numeric,
                1e-6,
                &format!("case {case} {name}"),
            );
        }
    }
    Ok(())
}

#[test]
fn gradients_match_candle_autograd() -> Result<()> {
    // Candle's own conv2d backward fails unless input and kernel are square (it derives the
    // transposed convolution's output padding from the heights alone), so only those here.
    let square = |c: &usize| CASES[*c].0[2] == CASES[*c].0[3] && CASES[*c].1[2] == CASES[*c].1[3];
    for case in (0..CASES.len()).filter(square) {
        let (x, w, stride, padding) = inputs(case);
        let ours = autograd(
            &|t| conv2d(&t[0], &t[1], stride, padding),
            &[x.clone(), w.clone()],
        )?;
        let candle = autograd(&|t| t[0].conv2d(&t[1], padding, stride, 1, 1), &[x, w])?;
        assert_close(&ours[0], &candle[0], 1e-12, &format!("case {case} dx"));
        assert_close(&ours[1], &candle[1], 1e-12, &format!("case {case} dw"));
    }
    Ok(())
}

#[test]
fn input_without_gradient_gets_none_and_weight_gradient_is_right() -> Result<()> {
    let (x, w, stride, padding) = inputs(1);
    let w_var = Var::from_tensor(&w)?;
    let grads = weighted_sum(&conv2d(&x, w_var.as_tensor(), stride, padding)?)?.backward()?;
    assert!(grads.get(&x).is_none(), "x is not a variable");
    let dw = grads.get(w_var.as_tensor()).expect("weight gradient");
    let candle = autograd(&|t| t[0].conv2d(&t[1], padding, stride, 1, 1), &[x, w])?;
    assert_close(&values(dw), &candle[1], 1e-12, "dw");
    Ok(())
}

#[test]
fn bad_shapes_are_errors() {
    let x = seeded(&[1, 3, 5, 5], 50);
    assert!(
        conv2d(&x, &seeded(&[2, 4, 3, 3], 51), 1, 1).is_err(),
        "channel mismatch"
    );
    assert!(
        conv2d(&x, &seeded(&[2, 3, 9, 9], 52), 1, 1).is_err(),
        "kernel too large"
    );
    assert!(
        conv2d(&x, &seeded(&[2, 3, 3, 3], 53), 0, 1).is_err(),
        "zero stride"
    );
    assert!(
        conv2d(&x.flatten_all().unwrap(), &seeded(&[2, 3, 3, 3], 54), 1, 1).is_err(),
        "rank"
    );
}

#[test]
fn backward_add_adds_the_input_gradient_into_the_tensor_and_its_clones() -> Result<()> {
    for case in [0, 1, 3, 6, 11] {
        let (x, w, stride, padding) = inputs(case);
        for dtype in [DType::F64, DType::F32] {
            let (x, w) = (x.to_dtype(dtype)?, w.to_dtype(dtype)?);
            let y = conv2d_forward(&x, &w, stride, padding)?;
            let dy = seeded(y.dims(), 90 + case as u64).to_dtype(dtype)?;
            let (dx, dw) = conv2d_backward(&x, &w, &dy, stride, padding, true)?;
            let acc = seeded(x.dims(), 70 + case as u64).to_dtype(dtype)?;
            let expected: Vec<f64> = values(&acc)
                .iter()
                .zip(values(&dx.expect("dx")))
                .map(|(a, d)| a + d)
                .collect();
            let alias = acc.clone();
            let dw_add = conv2d_backward_add(&acc, &x, &w, &dy, stride, padding)?;
            let what = format!("case {case} {dtype:?}");
            // The same input-gradient kernel, then one addition: equal up to that rounding.
            assert_close(&values(&acc), &expected, 1e-6, &what);
            assert_close(&values(&alias), &expected, 1e-6, &format!("{what}, clone"));
            assert_close(&values(&dw_add), &values(&dw), 1e-6, &format!("{what}, dw"));
        }
    }
    Ok(())
}

/// `ConvOperands` prepared once, its backward from the saved tensors restored, runs the direct
/// passes' kernels on the same operands: output, input gradient, weight gradient and the
/// in-place input gradient equal to theirs bit for bit (f64).
#[test]
fn operands_restored_from_their_saved_tensors_give_the_direct_passes() -> Result<()> {
    for case in [0, 1, 3, 5, 11] {
        let (x, w, stride, padding) = inputs(case);
        let operands = ConvOperands::new(&x, &w, stride, padding)?;
        let y = operands.forward()?;
        let dy = seeded(y.dims(), 50 + case as u64);
        let restored = ConvOperands::restore(operands.saved(), &w, stride, padding)?;
        let (dx, dw) = restored.backward(&dy, true)?;
        let (direct_dx, direct_dw) = conv2d_backward(&x, &w, &dy, stride, padding, true)?;
        let what = format!("case {case}");
        assert_eq!(
            values(&y),
            values(&conv2d_forward(&x, &w, stride, padding)?),
            "{what}"
        );
        assert_eq!(
            values(&dx.expect("asked for")),
            values(&direct_dx.expect("asked for"))
        );
        assert_eq!(values(&dw), values(&direct_dw), "{what}, dw");
        let (acc, direct_acc) = (seeded(x.dims(), 60), seeded(x.dims(), 60));
        let dw_add = restored.backward_add(&acc, &dy)?;
        conv2d_backward_add(&direct_acc, &x, &w, &dy, stride, padding)?;
        assert_eq!(values(&acc), values(&direct_acc), "{what}, added");
        assert_eq!(
            values(&dw_add),
            values(&direct_dw),
            "{what}, dw with the add"
        );
    }
    Ok(())
}

#[test]
fn backward_add_refuses_a_tensor_of_another_shape_or_layout() -> Result<()> {
    let (x, w, stride, padding) = inputs(0);
    let dy = seeded(conv2d_forward(&x, &w, stride, padding)?.dims(), 60);
    let wrong_shape = seeded(&[2, 3, 6, 5], 61);
    assert!(conv2d_backward_add(&wrong_shape, &x, &w, &dy, stride, padding).is_err());
    let transposed = seeded(&[2, 3, 6, 6], 62).transpose(2, 3)?;
    assert!(conv2d_backward_add(&transposed, &x, &w, &dy, stride, padding).is_err());
    let wrong_dtype = seeded(&[2, 3, 6, 6], 63).to_dtype(DType::F32)?;
    assert!(conv2d_backward_add(&wrong_dtype, &x, &w, &dy, stride, padding).is_err());
    Ok(())
}

/// The weight gradient is the same to the bit however rayon's threads share the work: twenty
/// runs on a 4-thread pool, the images spread over many units, give one result in f32 (the
/// per-thread accumulators are summed in a fixed order).
#[test]
fn weight_gradient_is_reproducible_on_many_threads() -> Result<()> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .build()
        .unwrap();
    let x = seeded(&[64, 8, 12, 12], 91).to_dtype(DType::F32)?;
    let w = seeded(&[16, 8, 3, 3], 92).to_dtype(DType::F32)?;
    let dy = seeded(&[64, 16, 12, 12], 93).to_dtype(DType::F32)?;
    let run =
        || pool.install(|| conv2d_backward(&x, &w, &dy, 1, 1, false).map(|(_, dw)| values(&dw)));
    let first = run()?;
    for attempt in 0..20 {
        assert!(
            run()? == first,
            "attempt {attempt}: a different weight gradient"
        );
    }
    Ok(())
}
