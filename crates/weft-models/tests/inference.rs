//! Inference (`Mode::INFER`) takes the graph-free kernels — batch norm with the running
//! statistics in one table pass, max-pool and the residual add + ReLU without an autograd
//! graph — and computes what the differentiable evaluation mode (`Mode::EVAL`) computes.

use candle_core::{DType, Device, Tensor};
use weft_models::resnet;
use weft_models::resnet::{BlockKind, ResNetConfig, StemKind};
use weft_tensor::{BlockModel, Mode};

fn tiny(dtype: DType) -> BlockModel {
    let config = ResNetConfig {
        block: BlockKind::Bottleneck,
        layers: vec![1, 2],
        stem_width: 4,
        widths: vec![4, 8],
        stem: StemKind::ImageNet,
        num_classes: 3,
        zero_init_residual: false,
        seed: 11,
        channels_last: false,
    };
    resnet(&config, dtype, &Device::Cpu).unwrap()
}

fn largest_relative_difference(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b): (Vec<f64>, Vec<f64>) = (
        a.to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap(),
        b.to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap(),
    );
    let scale = a.iter().fold(0f64, |m, v| m.max(v.abs()));
    a.iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs() / scale))
}

/// Two training forwards first, so that the running statistics are not their initial 0 and 1
/// (inference must read them, not the batch's).
fn trained_then_inferred(dtype: DType, x: &Tensor) -> (Tensor, Tensor) {
    let model = tiny(dtype);
    let x = x.to_dtype(dtype).unwrap();
    for shift in [0.5, -0.25] {
        model.forward(&(&x + shift).unwrap(), Mode::TRAIN).unwrap();
    }
    let eval = model.forward(&x, Mode::EVAL).unwrap();
    let infer = model.forward(&x, Mode::INFER).unwrap();
    (eval, infer)
}

#[test]
fn inference_equals_the_differentiable_evaluation() {
    let x = Tensor::randn(0f64, 1.0, (4, 3, 32, 32), &Device::Cpu).unwrap();
    // f64: the same formula, its operations in another order.
    let (eval, infer) = trained_then_inferred(DType::F64, &x);
    let f64_difference = largest_relative_difference(&eval, &infer);
    assert!(f64_difference < 1e-12, "f64: {f64_difference}");
    // bf16 against f64: within 4 units of bf16 (2^-8) of the largest logit over the
    // network (measured 1.6).
    let (_, bf16_infer) = trained_then_inferred(DType::BF16, &x);
    let bf16_difference = largest_relative_difference(&infer, &bf16_infer);
    assert!(
        bf16_difference < 4.0 * 2f64.powi(-8),
        "bf16 inference against f64: {bf16_difference}"
    );
}
