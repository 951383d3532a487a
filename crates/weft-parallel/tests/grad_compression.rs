//! DDP's gradient compression (PyTorch's bf16/fp16 compress hooks): two thread ranks of an f32
//! model take one plain-SGD step (learning rate 1, so the update is the averaged gradient)
//! with buckets reduced in bf16 or fp16, against the same step reduced in f32. Each rank's
//! gradient is rounded to 16 bits, averaged, and the average rounded again, so every element
//! is within u·(|g0| + |g1|)/2 + u·|average| of the exact average (u = 2^-8 for bf16, 2^-11
//! for fp16; the ranks' own gradients g0, g1 from one-process steps on their rows), and not
//! every element is exact (the compression happened).

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use weft_collectives::{Communicator, ShmCommunicator};
use weft_models::loss::Classification;
use weft_optim::{ModelOptimizer, Sgd, SgdConfig};
use weft_parallel::{DdpConfig, DistributedDataParallel, GradCompression, Trainer};
use weft_tensor::{Checkpointing, Mode};
use weft_testing::{flat_params, tiny_resnet};

fn batch() -> (Tensor, Tensor) {
    let values: Vec<f32> = (0..4 * 3 * 6 * 6)
        .map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let x = Tensor::from_vec(values, (4, 3, 6, 6), &Device::Cpu).unwrap();
    (x, Tensor::new(&[0u32, 1, 2, 1], &Device::Cpu).unwrap())
}

fn trainer() -> Trainer {
    let sgd = Sgd::<f32>::new(SgdConfig {
        lr: 1.0,
        ..SgdConfig::default()
    })
    .unwrap();
    Trainer::new(
        tiny_resnet(9, 3, DType::F32),
        Box::new(Classification),
        ModelOptimizer::host_f32(sgd),
        Checkpointing::None,
    )
    .unwrap()
    .with_mode(Mode::EVAL)
}

/// The parameter update of one step of `t` on `x`, `y`.
fn delta(t: &mut Trainer, x: &Tensor, y: &Tensor) -> Vec<f64> {
    let before = flat_params(t.model().store());
    t.step(x, y, 1.0).unwrap();
    let after = flat_params(t.model().store());
    before.iter().zip(&after).map(|(b, a)| b - a).collect()
}

/// The parameter update of one step on two ranks with `compression`.
fn update(compression: GradCompression) -> Vec<f64> {
    let (x, y) = batch();
    let comms = ShmCommunicator::new_thread_group(2).unwrap();
    let mut results: Vec<Vec<f64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let (x, y) = (&x, &y);
                scope.spawn(move || {
                    let comm: Arc<dyn Communicator> = Arc::new(comm);
                    let t = trainer();
                    let config = DdpConfig {
                        grad_compression: compression,
                        bucket_cap_mb: 0.001,
                        first_bucket_cap_mb: 0.001,
                        ..DdpConfig::default()
                    };
                    let ddp =
                        DistributedDataParallel::new(t.model(), t.grads(), comm, config).unwrap();
                    let mut t = t.with_strategy(Box::new(ddp)).unwrap();
                    let rows = |t: &Tensor| t.narrow(0, rank * 2, 2).unwrap();
                    delta(&mut t, &rows(x), &rows(y))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results[0], results[1], "both ranks apply the same update");
    results.remove(0)
}

#[test]
fn compressed_buckets_average_to_the_exact_gradients_rounded_to_16_bits() {
    let exact = update(GradCompression::None);
    let (x, y) = batch();
    let local: Vec<Vec<f64>> = (0..2)
        .map(|rank| {
            let rows = |t: &Tensor| t.narrow(0, rank * 2, 2).unwrap();
            delta(&mut trainer(), &rows(&x), &rows(&y))
        })
        .collect();
    for (compression, u) in [
        (GradCompression::Bf16, 2f64.powi(-8)),
        (GradCompression::Fp16, 2f64.powi(-11)),
    ] {
        let compressed = update(compression);
        let mut rounded = 0;
        for (i, (a, b)) in exact.iter().zip(&compressed).enumerate() {
            let bound = u * (local[0][i].abs() + local[1][i].abs()) / 2.0 + u * a.abs() + 1e-6;
            assert!(
                (a - b).abs() <= bound,
                "{compression:?}: element {i}: {b} against {a} (bound {bound})"
            );
            rounded += usize::from(a != b);
        }
        assert!(rounded > 0, "{compression:?}: no element was rounded");
    }
}
