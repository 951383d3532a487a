//! Gradient clipping by global norm with `torch.nn.utils.clip_grad_norm_`'s rule, in f64: the
//! clipped update equals the unclipped gradient scaled by `max_norm / (‖g‖ + 1e-6)` (computed
//! here by hand from the unclipped run), a norm below the limit leaves the step unchanged, and
//! under DDP (two thread ranks) the clipped run equals one process on the global batch.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use weft_collectives::{Communicator, ShmCommunicator};
use weft_models::loss::Classification;
use weft_optim::{ModelOptimizer, Sgd, SgdConfig};
use weft_parallel::{DdpConfig, DistributedDataParallel, Trainer};
use weft_tensor::{Checkpointing, Mode};
use weft_testing::{assert_close, flat_params, tiny_resnet};

const LR: f64 = 0.1;

/// Plain SGD (no momentum, no decay): the update is exactly `lr · g`.
fn trainer(clip: Option<f64>) -> Trainer {
    let sgd = Sgd::<f64>::new(SgdConfig {
        lr: LR,
        ..SgdConfig::default()
    })
    .unwrap();
    let t = Trainer::new(
        tiny_resnet(5, 3, DType::F64),
        Box::new(Classification),
        ModelOptimizer::host_f64(sgd),
        Checkpointing::None,
    )
    .unwrap()
    .with_mode(Mode::EVAL);
    match clip {
        Some(max) => t.with_clip_grad_norm(max).unwrap(),
        None => t,
    }
}

fn batch() -> (Tensor, Tensor) {
    let x = Tensor::randn(0f64, 1.0, (4, 3, 6, 6), &Device::Cpu).unwrap();
    (x, Tensor::new(&[0u32, 1, 2, 1], &Device::Cpu).unwrap())
}

#[test]
fn clipping_scales_the_update_as_torch_does() {
    let (x, y) = batch();
    let mut plain = trainer(None);
    let before = flat_params(plain.model().store());
    plain.step(&x, &y, LR).unwrap();
    let grads: Vec<f64> = flat_params(plain.model().store())
        .iter()
        .zip(&before)
        .map(|(after, b)| (b - after) / LR)
        .collect();
    let norm = grads.iter().map(|g| g * g).sum::<f64>().sqrt();
    for max_norm in [norm / 4.0, norm * 2.0] {
        let mut clipped = trainer(Some(max_norm));
        let outcome = clipped.step(&x, &y, LR).unwrap();
        assert!(
            (outcome.metric("grad_norm") - norm).abs() <= 1e-9 * norm,
            "reported {} against {norm}",
            outcome.metric("grad_norm")
        );
        let coefficient = (max_norm / (norm + 1e-6)).min(1.0);
        let expected: Vec<f64> = before
            .iter()
            .zip(&grads)
            .map(|(p, g)| p - LR * g * coefficient)
            .collect();
        assert_close(
            &flat_params(clipped.model().store()),
            &expected,
            1e-10,
            &format!("max_norm {max_norm}"),
        );
    }
    assert!(trainer(None).with_clip_grad_norm(0.0).is_err());
}

#[test]
fn clipping_under_ddp_equals_one_process_on_the_global_batch() {
    let (x, y) = batch();
    let mut single = trainer(Some(0.05));
    single.step(&x, &y, LR).unwrap();
    let reference = flat_params(single.model().store());
    let comms = ShmCommunicator::new_thread_group(2).unwrap();
    let results: Vec<Vec<f64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let (x, y) = (&x, &y);
                scope.spawn(move || {
                    let comm: Arc<dyn Communicator> = Arc::new(comm);
                    let t = trainer(Some(0.05));
                    let ddp = DistributedDataParallel::new(
                        t.model(),
                        t.grads(),
                        comm,
                        DdpConfig::default(),
                    )
                    .unwrap();
                    let mut t = t.with_strategy(Box::new(ddp)).unwrap();
                    let rows = |t: &Tensor| t.narrow(0, rank * 2, 2).unwrap();
                    t.step(&rows(x), &rows(y), LR).unwrap();
                    flat_params(t.model().store())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, params) in results.iter().enumerate() {
        assert_close(params, &reference, 1e-10, &format!("rank {rank}"));
    }
}
