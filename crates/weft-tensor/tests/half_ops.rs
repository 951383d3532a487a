//! 16-bit tensors on the CPU: convolution, max-pool and batch norm compute in f32 inside and
//! round their results back, so each output and gradient is exactly the f32 computation's
//! rounded to bf16 or f16 (Candle's CPU matmul has no 16-bit path of its own).

use candle_core::{DType, Device, Tensor, Var};
use weft_tensor::ops;

fn values(n: usize, salt: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 + salt * 104_729) % 997) as f32 / 498.5 - 1.0)
        .collect()
}

fn tensor(shape: &[usize], salt: usize) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec(values(n, salt), shape, &Device::Cpu).unwrap()
}

fn round(t: &Tensor, dtype: DType) -> Vec<f32> {
    t.to_dtype(dtype)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// `f(x)` in `dtype` and in f32 on the same (16-bit) values: the output must be the f32 one
/// rounded to `dtype`, and the input gradient (of `sum(f(x) · pattern)`) within one rounding.
fn check(name: &str, shape: &[usize], dtype: DType, f: impl Fn(&Tensor) -> Tensor) {
    let x32 = tensor(shape, 1)
        .to_dtype(dtype)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let run = |x: Tensor| {
        let var = Var::from_tensor(&x).unwrap();
        let y = f(var.as_tensor());
        let pattern = tensor(y.dims(), 2).to_dtype(y.dtype()).unwrap();
        let grads = (&y * &pattern)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        (y, grads.get(var.as_tensor()).unwrap().clone())
    };
    let (y32, dx32) = run(x32.clone());
    let (y, dx) = run(x32.to_dtype(dtype).unwrap());
    assert_eq!(y.dtype(), dtype, "{name}");
    assert_eq!(
        round(&y, DType::F32),
        round(&y32, dtype),
        "{name} {dtype:?} output"
    );
    assert_eq!(dx.dtype(), dtype, "{name}");
    // The gradient flows back through the 16-bit output, so it is the f32 gradient of a
    // 16-bit-rounded upstream: compare within one rounding of the format.
    let (a, b) = (round(&dx, DType::F32), round(&dx32, DType::F32));
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let eps = if dtype == DType::BF16 {
        2f32.powi(-7)
    } else {
        2f32.powi(-10)
    };
    for (i, (p, q)) in a.iter().zip(&b).enumerate() {
        assert!(
            (p - q).abs() <= 2.0 * eps * scale,
            "{name} {dtype:?} gradient {i}: {p} vs {q}"
        );
    }
}

#[test]
fn convolution_pooling_and_batch_norm_work_in_16_bits_on_the_cpu() {
    for dtype in [DType::BF16, DType::F16] {
        let w = tensor(&[4, 3, 3, 3], 3).to_dtype(dtype).unwrap();
        let w32 = w.to_dtype(DType::F32).unwrap();
        check("conv2d", &[2, 3, 7, 7], dtype, |x| {
            let w = if x.dtype() == DType::F32 { &w32 } else { &w };
            ops::conv2d(x, w, 2, 1).unwrap()
        });
        check("max_pool2d 3x3/2", &[2, 3, 7, 7], dtype, |x| {
            ops::max_pool2d(x, 3, 2, 1).unwrap()
        });
        check("batch_norm_train", &[4, 3, 5, 5], dtype, |x| {
            let ones = Tensor::ones(3, x.dtype(), &Device::Cpu).unwrap();
            let zeros = Tensor::zeros(3, x.dtype(), &Device::Cpu).unwrap();
            ops::batch_norm_train(x, &ones, &zeros, 1e-5).unwrap().0
        });
    }
}
