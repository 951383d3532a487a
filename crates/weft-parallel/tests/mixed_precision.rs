//! Mixed precision on the CPU: a tiny ResNet whose working copy is bf16 (or fp16, with the loss
//! scaled) computes forward and backward through ops that work in f32 inside, while the
//! optimizer steps fp32 master weights with fp32 gradients and writes the 16-bit copy back.
//! Against the same model in f32: the losses agree to three roundings of the 16-bit formats
//! over four steps (3·2^-8 relative for bf16, 3·2^-11 for fp16; seen: 1.0e-3 and 1.2e-4), the
//! master weights stay within 5 % of the largest f32 weight, and the working copy is exactly
//! the master rounded to 16 bits.

use candle_core::{DType, Device, Tensor};
use weft_models::loss::Classification;
use weft_optim::{ModelOptimizer, Sgd, SgdConfig};
use weft_parallel::Trainer;
use weft_precision::{DynamicLossScaler, ScalerConfig};
use weft_tensor::{Checkpointing, FlatLayout, Mode};
use weft_testing::{flat_params, tiny_resnet};

fn trainer(dtype: DType) -> Trainer {
    let sgd = Sgd::<f32>::new(SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        ..SgdConfig::default()
    })
    .unwrap();
    Trainer::new(
        tiny_resnet(2, 3, dtype),
        Box::new(Classification),
        ModelOptimizer::host_f32(sgd),
        Checkpointing::None,
    )
    .unwrap()
    .with_mode(Mode::TRAIN)
}

fn batch(step: usize, dtype: DType) -> (Tensor, Tensor) {
    let values: Vec<f32> = (0..8 * 3 * 6 * 6)
        .map(|i| ((i * 7919 + step * 31) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let x = Tensor::from_vec(values, (8, 3, 6, 6), &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let y: Vec<u32> = (0..8).map(|i| ((i + step) % 3) as u32).collect();
    (x, Tensor::from_vec(y, 8, &Device::Cpu).unwrap())
}

#[test]
fn bf16_and_fp16_working_copies_train_like_f32_with_fp32_masters() {
    let mut reference = trainer(DType::F32);
    let losses: Vec<f64> = (0..4)
        .map(|step| {
            let (x, y) = batch(step, DType::F32);
            reference.step(&x, &y, 0.05).unwrap().loss
        })
        .collect();
    for (dtype, tolerance) in [
        (DType::BF16, 3.0 * 2f64.powi(-8)),
        (DType::F16, 3.0 * 2f64.powi(-11)),
    ] {
        let mut mixed = trainer(dtype);
        if dtype == DType::F16 {
            mixed =
                mixed.with_loss_scaler(DynamicLossScaler::new(ScalerConfig::default()).unwrap());
        }
        assert_eq!(
            mixed.grads().dtype(),
            DType::F32,
            "fp32 gradients (main_grad)"
        );
        for (step, expected) in losses.iter().enumerate() {
            let (x, y) = batch(step, dtype);
            let outcome = mixed.step(&x, &y, 0.05).unwrap();
            assert!(!outcome.skipped, "{dtype:?} step {step} skipped");
            assert!(
                (outcome.loss - expected).abs() <= tolerance * expected.abs(),
                "{dtype:?} step {step}: loss {} against f32's {expected}",
                outcome.loss
            );
        }
        // The working copy is the master weights rounded to 16 bits.
        let store = mixed.model().store();
        let layout = FlatLayout::parameters(store);
        assert_eq!(store.entries()[layout.slots()[0].entry].var.dtype(), dtype);
        let working = flat_params(store);
        let master = mixed
            .master_weights()
            .unwrap()
            .expect("a master copy")
            .to_dtype(DType::F64)
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let rounded: Vec<f64> = Tensor::new(master.as_slice(), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(working, rounded, "{dtype:?}");
        // And the master weights followed the f32 run.
        let f32_params = flat_params(reference.model().store());
        let scale = f32_params.iter().fold(0f64, |m, v| m.max(v.abs()));
        let worst = master
            .iter()
            .zip(&f32_params)
            .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            worst <= 0.05 * scale,
            "{dtype:?}: master off by {worst} (scale {scale})"
        );
    }
}
