//! The trainer with the tensor SGD (the GPU path) against the trainer with the slice SGD (the
//! CPU path), both on the CPU in f64 with the same model, data and hyperparameters: after
//! several steps the parameters agree to 1e-12 relative, the rounding of the two update
//! loops being the only difference.

use candle_core::{DType, Device, Tensor};
use weft_models::loss::Classification;
use weft_optim::ModelOptimizer;
use weft_optim::{Sgd, SgdConfig, TensorSgd};
use weft_parallel::Trainer;
use weft_tensor::Checkpointing;
use weft_testing::{flat_params, tiny_resnet};

fn trainer(optimizer: ModelOptimizer) -> Trainer {
    let model = tiny_resnet(7, 3, DType::F64);
    Trainer::new(
        model,
        Box::new(Classification),
        optimizer,
        Checkpointing::None,
    )
    .unwrap()
}

#[test]
fn tensor_sgd_trains_like_slice_sgd() {
    let config = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        weight_decay: 1e-4,
        nesterov: true,
        ..SgdConfig::default()
    };
    let mut slice = trainer(ModelOptimizer::F64(Box::new(
        Sgd::<f64>::new(config.clone()).unwrap(),
    )));
    let mut tensor = trainer(ModelOptimizer::Tensor(TensorSgd::new(config).unwrap()));
    for step in 0..4 {
        let x = Tensor::randn(0f64, 1.0, (4, 3, 6, 6), &Device::Cpu).unwrap();
        let y = Tensor::from_vec(
            (0..4).map(|i| ((i + step) % 3) as u32).collect::<Vec<_>>(),
            4,
            &Device::Cpu,
        )
        .unwrap();
        let lr = 0.1 / (1 + step) as f64;
        let a = slice.step(&x, &y, lr).unwrap().loss;
        let b = tensor.step(&x, &y, lr).unwrap().loss;
        assert!(
            (a - b).abs() <= 1e-12 * a.abs(),
            "step {step}: loss {a} vs {b}"
        );
    }
    let (a, b) = (
        flat_params(slice.model().store()),
        flat_params(tensor.model().store()),
    );
    let scale = a.iter().fold(0f64, |m, v| m.max(v.abs()));
    let worst = a
        .iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    assert!(
        worst <= 1e-12 * scale,
        "parameters differ by {worst} (scale {scale})"
    );
}
