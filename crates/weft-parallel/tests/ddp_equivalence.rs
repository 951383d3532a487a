//! Data parallelism against single-process training: N ranks (threads over the shared-memory
//! backend) with per-rank batch B end with the same parameters as one process with batch N·B
//! on the same samples. BatchNorm runs in evaluation mode here, so every rank normalises with
//! the same (running) statistics and the only difference between the two runs is the order of
//! floating-point sums: in f64 the parameters agree to 1e-10 relative after several steps.

use std::sync::Arc;
use std::thread;

use candle_core::{DType, Tensor};
use weft_collectives::{Communicator, ShmCommunicator};
use weft_parallel::Trainer;
use weft_parallel::{DdpConfig, DistributedDataParallel, NaiveDataParallel, Strategy};
use weft_tensor::{Mode, Timeline};
use weft_testing::{flat_buffers, flat_params, tiny_resnet};

mod common;

const B: usize = 2;
const STEPS: usize = 3;

fn trainer(seed: u64) -> Trainer {
    common::sgd_classifier(tiny_resnet(seed, 3, DType::F64), 0.9, 1e-4).with_mode(Mode::EVAL)
}

fn batches(n: usize) -> Vec<(Tensor, Tensor)> {
    weft_testing::image_batches(STEPS, n)
}

fn params(t: &Trainer) -> Vec<f64> {
    flat_params(t.model().store())
}

/// The BatchNorm buffers (running mean and variance, batches counted), flattened in f64.
fn buffers(t: &Trainer) -> Vec<f64> {
    flat_buffers(t.model().store())
}

/// f64 runs that differ only in the order of sums.
fn assert_close(a: &[f64], b: &[f64], what: &str) {
    weft_testing::assert_close(a, b, 1e-10, what);
}

/// Each rank trains on its rows `r*per_rank..(r+1)*per_rank` of every batch, in `micro` micro-batches.
fn run_ranks<S>(
    world: usize,
    data: &[(Tensor, Tensor)],
    micro: usize,
    make_sync: S,
) -> Vec<Vec<f64>>
where
    S: Fn(&Trainer, Arc<dyn Communicator>) -> Box<dyn Strategy> + Sync,
{
    let comms = ShmCommunicator::new_thread_group(world).unwrap();
    thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let make_sync = &make_sync;
                scope.spawn(move || {
                    let comm: Arc<dyn Communicator> = Arc::new(comm);
                    let plain = trainer(0);
                    let sync = make_sync(&plain, comm);
                    let mut t = plain.with_strategy(sync).unwrap();
                    let per_rank = data[0].1.elem_count() / world;
                    for (x, y) in data {
                        let mine = |t: &Tensor, start, len| t.narrow(0, start, len).unwrap();
                        let per_micro = per_rank / micro;
                        let parts: Vec<(Tensor, Tensor)> = (0..micro)
                            .map(|m| {
                                let start = rank * per_rank + m * per_micro;
                                (mine(x, start, per_micro), mine(y, start, per_micro))
                            })
                            .collect();
                        t.step_accumulated(&parts, 0.1).unwrap();
                    }
                    params(&t)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn single_process(data: &[(Tensor, Tensor)]) -> Vec<f64> {
    let mut t = trainer(0);
    for (x, y) in data {
        t.step(x, y, 0.1).unwrap();
    }
    params(&t)
}

fn ddp(config: DdpConfig) -> impl Fn(&Trainer, Arc<dyn Communicator>) -> Box<dyn Strategy> + Sync {
    move |t, comm| {
        Box::new(DistributedDataParallel::new(t.model(), t.grads(), comm, config.clone()).unwrap())
    }
}

#[test]
fn bucketed_and_naive_ddp_match_one_process_on_the_global_batch() {
    let tiny_buckets = DdpConfig {
        bucket_cap_mb: 0.0005,
        first_bucket_cap_mb: 0.0002,
        ..DdpConfig::default()
    };
    for world in [2, 3, 4] {
        let data = batches(world * B);
        let reference = single_process(&data);
        let naive = run_ranks(world, &data, 1, |t, comm| {
            Box::new(NaiveDataParallel::new(t.model(), comm, false).unwrap())
        });
        let bucketed = run_ranks(world, &data, 1, ddp(DdpConfig::default()));
        let many_buckets = run_ranks(world, &data, 1, ddp(tiny_buckets.clone()));
        let small_last = DdpConfig {
            last_bucket_cap_mb: 0.0002,
            ..tiny_buckets.clone()
        };
        let small_last = run_ranks(world, &data, 1, ddp(small_last));
        for rank in 0..world {
            assert_close(
                &naive[rank],
                &reference,
                &format!("naive, world {world}, rank {rank}"),
            );
            assert_close(
                &bucketed[rank],
                &naive[rank],
                &format!("bucketed, world {world}, rank {rank}"),
            );
            assert_close(
                &many_buckets[rank],
                &naive[rank],
                &format!("small buckets, world {world}, rank {rank}"),
            );
            assert_close(
                &small_last[rank],
                &naive[rank],
                &format!("a small last bucket, world {world}, rank {rank}"),
            );
        }
    }
}

#[test]
fn small_caps_give_many_buckets() {
    let t = trainer(0);
    let comm: Arc<dyn Communicator> =
        Arc::new(ShmCommunicator::new_thread_group(1).unwrap().remove(0));
    let config = DdpConfig {
        bucket_cap_mb: 0.0005,
        first_bucket_cap_mb: 0.0002,
        ..DdpConfig::default()
    };
    let ddp = DistributedDataParallel::new(t.model(), t.grads(), comm.clone(), config);
    let buckets = ddp.unwrap().plan().buckets().len();
    assert!(buckets >= 5, "{buckets} buckets");
    // With a last cap, the first parameters (the last gradients) get a bucket of their own,
    // as many as fit (f64: 8 bytes an element), where the reverse walk ends elsewhere.
    let last_of = |last_bucket_cap_mb: f64| {
        let config = DdpConfig {
            bucket_cap_mb: 0.004,
            first_bucket_cap_mb: 0.0002,
            last_bucket_cap_mb,
            ..DdpConfig::default()
        };
        let ddp = DistributedDataParallel::new(t.model(), t.grads(), comm.clone(), config);
        ddp.unwrap().plan().buckets().last().unwrap().clone()
    };
    let (walked, capped) = (last_of(0.0), last_of(0.001));
    assert_eq!(capped.range.start, 0, "{capped:?}");
    assert!(capped.range.len() * 8 <= 1048, "{capped:?}");
    assert_ne!(capped, walked, "the last bucket is the reverse walk's");
}

#[test]
fn no_sync_gradient_accumulation_equals_the_large_batch() {
    let world = 2;
    let data = batches(world * 2 * B);
    let reference = single_process(&data);
    let accumulated = run_ranks(world, &data, 2, ddp(DdpConfig::default()));
    for (rank, p) in accumulated.iter().enumerate() {
        assert_close(p, &reference, &format!("accumulated, rank {rank}"));
    }
}

#[test]
fn construction_broadcasts_rank_zero_parameters_over_different_inits() {
    let comms = ShmCommunicator::new_thread_group(3).unwrap();
    let results: Vec<Vec<f64>> = thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                scope.spawn(move || {
                    let t = trainer(100 + rank as u64);
                    let before = params(&t);
                    DistributedDataParallel::new(
                        t.model(),
                        t.grads(),
                        Arc::new(comm),
                        DdpConfig::default(),
                    )
                    .unwrap();
                    (before, params(&t))
                })
            })
            .collect();
        let pairs: Vec<(Vec<f64>, Vec<f64>)> =
            handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_ne!(
            pairs[0].0, pairs[1].0,
            "ranks must start different for this test to mean anything"
        );
        pairs.into_iter().map(|(_, after)| after).collect()
    });
    let rank0_init = params(&trainer(100));
    for (rank, p) in results.iter().enumerate() {
        assert_eq!(
            p, &rank0_init,
            "rank {rank} does not hold rank 0's parameters"
        );
    }
}

#[test]
fn a_rank_with_another_model_is_named() {
    let comms = ShmCommunicator::new_thread_group(2).unwrap();
    let errors: Vec<String> = thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                scope.spawn(move || {
                    let classes = if rank == 1 { 4 } else { 3 };
                    let model = tiny_resnet(0, classes, DType::F64);
                    NaiveDataParallel::new(&model, Arc::new(comm), false)
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_default()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in errors {
        assert!(e.contains("rank 1"), "error does not name rank 1: {e}");
    }
}

#[test]
fn first_bucket_all_reduce_starts_before_backward_finishes() {
    let comms = ShmCommunicator::new_thread_group(2).unwrap();
    let data = batches(2 * B);
    thread::scope(|scope| {
        for (rank, comm) in comms.into_iter().enumerate() {
            let data = &data;
            scope.spawn(move || {
                let timeline = Arc::new(Timeline::new(rank));
                let plain = trainer(0);
                let config = DdpConfig { bucket_cap_mb: 0.001, first_bucket_cap_mb: 0.001, ..DdpConfig::default() };
                let ddp = DistributedDataParallel::new(plain.model(), plain.grads(), Arc::new(comm), config)
                    .unwrap()
                    .with_timeline(timeline.clone());
                let mut t = plain.with_strategy(Box::new(ddp)).unwrap().with_timeline(timeline.clone());
                let (x, y) = &data[0];
                t.step(&x.narrow(0, rank * B, B).unwrap(), &y.narrow(0, rank * B, B).unwrap(), 0.1).unwrap();
                let spans = timeline.spans();
                let backward_end = spans.iter().filter(|s| s.category == "backward").map(|s| s.end_us()).fold(0.0, f64::max);
                let first_launch = spans.iter().filter(|s| s.category == "allreduce").map(|s| s.start_us).fold(f64::MAX, f64::min);
                assert!(first_launch < backward_end, "rank {rank}: first all-reduce at {first_launch} us, backward ends {backward_end} us");
            });
        }
    });
}

#[test]
fn sync_batch_norm_in_training_mode_matches_one_process() {
    // Training-mode BatchNorm: with SyncBatchNorm every rank normalises with the global
    // batch's statistics and updates its running statistics from them (the unbiased variance
    // over the global count), so parameters and buffers equal one process on the global batch
    // (f64, 1e-10).
    let world = 2;
    let data = batches(world * B);
    let train_mode = |t: Trainer| t.with_mode(Mode::TRAIN);
    let mut reference = train_mode(trainer(0));
    for (x, y) in &data {
        reference.step(x, y, 0.1).unwrap();
    }
    let reference = (params(&reference), buffers(&reference));
    assert!(!reference.1.is_empty(), "the model has BatchNorm buffers");
    let comms = ShmCommunicator::new_thread_group(world).unwrap();
    let results: Vec<(Vec<f64>, Vec<f64>)> = thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let data = &data;
                scope.spawn(move || {
                    let comm: Arc<dyn Communicator> = Arc::new(comm);
                    let plain = train_mode(trainer(0));
                    weft_parallel::convert_sync_batch_norm(plain.model(), comm.clone());
                    let ddp = DistributedDataParallel::new(
                        plain.model(),
                        plain.grads(),
                        comm,
                        DdpConfig::default(),
                    )
                    .unwrap();
                    let mut t = plain.with_strategy(Box::new(ddp)).unwrap();
                    for (x, y) in data {
                        t.step(
                            &x.narrow(0, rank * B, B).unwrap(),
                            &y.narrow(0, rank * B, B).unwrap(),
                            0.1,
                        )
                        .unwrap();
                    }
                    (params(&t), buffers(&t))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, (p, b)) in results.iter().enumerate() {
        assert_close(p, &reference.0, &format!("sync-bn rank {rank}"));
        assert_close(b, &reference.1, &format!("sync-bn rank {rank}, buffers"));
    }
}
