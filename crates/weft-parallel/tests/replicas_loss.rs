//! The step's loss summed over the data-parallel replicas inside the step (on the device, so
//! that a CUDA graph captures it and the host need not sum it between steps): under DDP, its
//! naive reference and ZeRO-1/2/3, on thread ranks, it equals the sum of each rank's own loss
//! over its samples. f64 throughout: the two sums differ only in the order of two additions,
//! so they agree to 1e-12 relative. One process has no replicas and reports none.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use weft_collectives::Communicator;
use weft_parallel::zero::{zero_stage1, zero_stage2, zero_stage3};
use weft_parallel::{DdpConfig, DistributedDataParallel, NaiveDataParallel, Strategy, Trainer};
use weft_testing::{on_thread_ranks, tiny_resnet};

mod common;

const PER_RANK: usize = 4;

fn trainer() -> Trainer {
    common::sgd_classifier(tiny_resnet(1, 3, DType::F64), 0.9, 0.0)
}

fn batch(step: usize) -> (Tensor, Tensor) {
    let x = Tensor::randn(step as f64, 1.0, (2 * PER_RANK, 3, 6, 6), &Device::Cpu).unwrap();
    let labels: Vec<u32> = (0..2 * PER_RANK).map(|i| ((i + step) % 3) as u32).collect();
    (x, Tensor::new(labels, &Device::Cpu).unwrap())
}

/// Each rank's (own loss sum, own samples, the step's sum over the replicas) for two steps,
/// the second in two micro-batches.
fn run(strategy: &str) -> Vec<Vec<(f64, f64, [f64; 2])>> {
    on_thread_ranks(2, |rank, comm: Arc<dyn Communicator>| {
        let t = trainer();
        let (model, grads, ddp) = (t.model(), t.grads(), DdpConfig::default());
        let strategy: Box<dyn Strategy> = match strategy {
            "naive" => Box::new(NaiveDataParallel::new(model, comm, false).unwrap()),
            "ddp" => Box::new(DistributedDataParallel::new(model, grads, comm, ddp).unwrap()),
            "zero1" => Box::new(zero_stage1(model, grads, comm, ddp).unwrap()),
            "zero2" => Box::new(zero_stage2(model, grads, comm, ddp).unwrap()),
            _ => Box::new(zero_stage3(model, grads, comm, ddp).unwrap()),
        };
        let mut t = t.with_strategy(strategy).unwrap();
        (0..2)
            .map(|step| {
                let (x, y) = batch(step);
                let mine = |t: &Tensor| t.narrow(0, rank * PER_RANK, PER_RANK).unwrap();
                let out = t
                    .step_micro_batches(&mine(&x), &mine(&y), step + 1, 0.1)
                    .unwrap();
                let summed = out.replicas_loss_sum().expect("summed over the replicas");
                (out.loss * out.samples as f64, out.samples as f64, summed)
            })
            .collect()
    })
}

#[test]
fn the_loss_is_summed_over_the_replicas_within_the_step() {
    for strategy in ["naive", "ddp", "zero1", "zero2", "zero3"] {
        let ranks = run(strategy);
        for step in 0..2 {
            let own: f64 = ranks.iter().map(|r| r[step].0).sum();
            let samples: f64 = ranks.iter().map(|r| r[step].1).sum();
            assert_eq!(samples, (2 * PER_RANK) as f64, "{strategy}");
            for (rank, r) in ranks.iter().enumerate() {
                let [sum, count] = r[step].2;
                let what = format!("{strategy}, step {step}, rank {rank}");
                assert!(
                    (sum - own).abs() <= 1e-12 * own.abs(),
                    "{what}: {sum} vs {own}"
                );
                assert_eq!(count, samples, "{what}");
            }
        }
    }
}

#[test]
fn one_process_has_no_replicas_to_sum_over() {
    let (x, y) = batch(0);
    let out = trainer().step(&x, &y, 0.1).unwrap();
    assert!(out.replicas_loss_sum().is_none());
    assert!(out.metrics.iter().all(|(name, _)| *name == "correct"));
}
