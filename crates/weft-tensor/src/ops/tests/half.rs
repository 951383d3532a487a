//! The graph-free kernels on 16-bit CPU tensors (the path a 16-bit ResNet block takes, on the
//! CPU as on a GPU): each equals the f32 kernel on the widened inputs, its data outputs rounded
//! once to the input's type and its batch-norm statistics kept in f32. The f32 kernel runs on
//! exactly the widened values, so the comparison is exact.

use super::support::seeded;
use crate::ops::{
    add_relu_forward, batch_norm_train_backward, batch_norm_train_forward, blend_into,
    conv2d_backward, conv2d_backward_add, conv2d_forward, has_kernels, max_pool2d_backward,
    max_pool2d_forward, relu_backward, BatchStats::Local,
};
use candle_core::{DType, Result, Tensor};

const HALF: [DType; 2] = [DType::BF16, DType::F16];

/// A seeded tensor rounded to `dtype`.
fn rounded(shape: &[usize], seed: u64, dtype: DType) -> Tensor {
    seeded(shape, seed).to_dtype(dtype).expect("a float dtype")
}

/// `t` widened to f32 (exact for 16-bit values).
fn wide(t: &Tensor) -> Tensor {
    t.to_dtype(DType::F32).expect("widens")
}

/// Asserts `half` equals `f32` rounded to `half`'s dtype, element for element.
fn assert_rounded(half: &Tensor, f32: &Tensor, what: &str) {
    assert_eq!(half.dims(), f32.dims(), "{what}: shape");
    let expected = f32.to_dtype(half.dtype()).expect("rounds");
    let (h, e) = (
        super::support::values(half),
        super::support::values(&expected),
    );
    assert_eq!(h, e, "{what} ({:?})", half.dtype());
}

fn assert_same(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.dtype(), b.dtype(), "{what}: dtype");
    assert_eq!(
        super::support::values(a),
        super::support::values(b),
        "{what}"
    );
}

#[test]
fn batch_norm_keeps_f32_statistics_and_rounds_its_data() -> Result<()> {
    for dtype in HALF {
        let x = (rounded(&[3, 4, 5, 5], 1, dtype) * 3.0)?.affine(1.0, 2.0)?;
        let (w, b) = (rounded(&[4], 2, dtype), rounded(&[4], 3, dtype));
        let dy = rounded(&[3, 4, 5, 5], 4, dtype);
        assert!(
            has_kernels(&x),
            "16-bit CPU tensors take the graph-free kernels"
        );
        for relu in [false, true] {
            let half = batch_norm_train_forward(&x, &w, &b, 1e-5, relu, Local)?;
            let full =
                batch_norm_train_forward(&wide(&x), &wide(&w), &wide(&b), 1e-5, relu, Local)?;
            assert_eq!(half.table.dtype(), DType::F32, "statistics in f32");
            assert_same(&half.table, &full.table, "table");
            assert_rounded(&half.y, &full.y, "y");
            let relu_output = relu.then_some(&half.y);
            let g =
                batch_norm_train_backward(&x, &half.table, relu_output, &dy, 1e-5, true, Local)?;
            // The f32 backward sees the rounded output as its ReLU mask, as the 16-bit one does.
            let mask = relu.then(|| wide(&half.y));
            let f = batch_norm_train_backward(
                &wide(&x),
                &full.table,
                mask.as_ref(),
                &wide(&dy),
                1e-5,
                true,
                Local,
            )?;
            assert_rounded(g.x.as_ref().expect("dx"), f.x.as_ref().expect("dx"), "dx");
            assert_same(&g.weight, &f.weight, "dweight");
            assert_same(&g.bias, &f.bias, "dbias");
        }
    }
    Ok(())
}

#[test]
fn running_statistics_of_16_bit_buffers_blend_f32_batch_statistics() -> Result<()> {
    for dtype in HALF {
        let running = rounded(&[6], 5, dtype).abs()?;
        let batch = seeded(&[6], 6).to_dtype(DType::F32)?;
        let reference: Vec<f64> = super::support::values(&running)
            .iter()
            .zip(super::support::values(&batch))
            .map(|(r, b)| 0.9 * r + 0.1 * 1.25 * b)
            .collect();
        blend_into(&running, &batch, 0.1, 1.25)?;
        let expected = Tensor::new(reference, running.device())?.to_dtype(dtype)?;
        assert_same(&running, &expected, "running statistics");
        let f64_batch = batch.to_dtype(DType::F64)?;
        assert!(blend_into(&running, &f64_batch, 0.1, 1.0).is_err());
    }
    Ok(())
}

#[test]
fn convolutions_compute_in_f32_and_round_once() -> Result<()> {
    for dtype in HALF {
        let x = rounded(&[2, 3, 7, 7], 7, dtype);
        let w = rounded(&[4, 3, 3, 3], 8, dtype);
        let y = conv2d_forward(&x, &w, 2, 1)?;
        let full = conv2d_forward(&wide(&x), &wide(&w), 2, 1)?;
        assert_rounded(&y, &full, "conv forward");
        let dy = rounded(y.dims(), 9, dtype);
        let (dx, dw) = conv2d_backward(&x, &w, &dy, 2, 1, true)?;
        let (fdx, fdw) = conv2d_backward(&wide(&x), &wide(&w), &wide(&dy), 2, 1, true)?;
        assert_rounded(&dx.expect("dx"), &fdx.expect("dx"), "conv dx");
        assert_rounded(&dw, &fdw, "conv dw");
        // Added into an accumulator: the f32 sum of its value and dx, rounded once.
        let acc = rounded(x.dims(), 10, dtype);
        let acc_f32 = wide(&acc);
        let dw_add = conv2d_backward_add(&acc, &x, &w, &dy, 2, 1)?;
        let expected = (acc_f32 + fdx_of(&x, &w, &dy)?)?;
        assert_rounded(&acc, &expected, "conv dx added");
        assert_rounded(&dw_add, &fdw, "conv dw beside the add");
    }
    Ok(())
}

fn fdx_of(x: &Tensor, w: &Tensor, dy: &Tensor) -> Result<Tensor> {
    let (dx, _) = conv2d_backward(&wide(x), &wide(w), &wide(dy), 2, 1, true)?;
    Ok(dx.expect("dx"))
}

#[test]
fn pooling_and_relu_passes_round_once() -> Result<()> {
    for dtype in HALF {
        let x = rounded(&[2, 3, 8, 8], 11, dtype);
        let y = max_pool2d_forward(&x, 3, 2, 1)?;
        assert_rounded(&y, &max_pool2d_forward(&wide(&x), 3, 2, 1)?, "max-pool");
        let dy = rounded(y.dims(), 12, dtype);
        let dx = max_pool2d_backward(&x, &y, &dy, 3, 2, 1)?;
        let full = max_pool2d_backward(&wide(&x), &wide(&y), &wide(&dy), 3, 2, 1)?;
        assert_rounded(&dx, &full, "max-pool backward");
        let b = rounded(&[2, 3, 8, 8], 13, dtype);
        let sum = add_relu_forward(&x, &b)?;
        assert_rounded(&sum, &add_relu_forward(&wide(&x), &wide(&b))?, "add_relu");
        let g = relu_backward(&sum, &b)?;
        assert_rounded(&g, &relu_backward(&wide(&sum), &wide(&b))?, "relu backward");
    }
    Ok(())
}
