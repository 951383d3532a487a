//! DDP's last bucket held through the update (`DdpConfig::step_during_last_bucket`, under
//! ZeRO-1 too): the trainer asks the strategy to hold one range back only when nothing reads
//! every gradient before the update (no loss scaler, no clipping), steps the rest first and
//! the held range last, after the strategy completed it. The values are those of the plain
//! update: in f64 the parameters agree bit for bit.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Tensor};
use weft_collectives::Communicator;
use weft_parallel::ddp::BucketPlan;
use weft_parallel::zero::zero_stage1;
use weft_parallel::{DdpConfig, DistributedDataParallel, ReadyGrads, Strategy, Trainer};
use weft_tensor::{FlatBuffer, Mode};
use weft_testing::{flat_params, image_batches, on_thread_ranks, tiny_resnet};

mod common;

const WORLD: usize = 2;
const B: usize = 2;

/// DDP (or ZeRO-1 over it), noting the trainer's calls of the hooks that end the gradient sync.
struct Noting {
    inner: Box<dyn Strategy>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Noting {
    fn note(&self, what: String) {
        self.log.lock().unwrap().push(what);
    }
}

impl Strategy for Noting {
    fn name(&self) -> &'static str {
        "noting"
    }
    fn wrapped(&self) -> Option<&dyn Strategy> {
        Some(self.inner.as_ref())
    }
    fn wrapped_mut(&mut self) -> Option<&mut dyn Strategy> {
        Some(self.inner.as_mut())
    }
    fn block_ready(&mut self, ready: &ReadyGrads, grads: &FlatBuffer) -> weft_parallel::Result<()> {
        self.inner.block_ready(ready, grads)
    }
    fn finish_backward(&mut self, grads: &FlatBuffer) -> weft_parallel::Result<()> {
        self.note("finish".into());
        self.inner.finish_backward(grads)
    }
    fn finish_backward_holding_last(
        &mut self,
        grads: &FlatBuffer,
    ) -> weft_parallel::Result<Option<Range<usize>>> {
        let held = self.inner.finish_backward_holding_last(grads)?;
        self.note(format!("holding {held:?}"));
        Ok(held)
    }
    fn finish_held_gradients(&mut self, grads: &FlatBuffer) -> weft_parallel::Result<()> {
        self.note("held done".into());
        self.inner.finish_held_gradients(grads)
    }
    fn set_require_sync(&mut self, sync: bool) {
        self.inner.set_require_sync(sync)
    }
}

fn trainer() -> Trainer {
    common::sgd_classifier(tiny_resnet(0, 3, DType::F64), 0.9, 1e-4).with_mode(Mode::EVAL)
}

/// What one rank ends with: its parameters, its log of the hooks, its plan's buckets.
struct Rank {
    params: Vec<f64>,
    log: Vec<String>,
    buckets: Vec<Range<usize>>,
}

/// Three steps on two thread ranks, under DDP or (`zero1`) ZeRO-1 over it.
fn run(data: &[(Tensor, Tensor)], config: DdpConfig, clip: bool, zero1: bool) -> Vec<Rank> {
    on_thread_ranks(WORLD, |rank, comm: Arc<dyn Communicator>| {
        let plain = trainer();
        let (model, grads) = (plain.model(), plain.grads());
        let plan = BucketPlan::new(grads.layout(), 8, config.bucket_caps());
        let buckets = plan.buckets().iter().map(|b| b.range.clone()).collect();
        let inner: Box<dyn Strategy> = match zero1 {
            true => Box::new(zero_stage1(model, grads, comm, config.clone()).unwrap()),
            false => {
                Box::new(DistributedDataParallel::new(model, grads, comm, config.clone()).unwrap())
            }
        };
        let log = Arc::new(Mutex::new(Vec::new()));
        let noting = Noting {
            inner,
            log: log.clone(),
        };
        let mut t = plain.with_strategy(Box::new(noting)).unwrap();
        if clip {
            t = t.with_clip_grad_norm(1.0).unwrap();
        }
        let mine = |t: &Tensor| t.narrow(0, rank * B, B).unwrap();
        for (x, y) in data {
            t.step(&mine(x), &mine(y), 0.1).unwrap();
        }
        let log = log.lock().unwrap().clone();
        Rank {
            params: flat_params(t.model().store()),
            log,
            buckets,
        }
    })
}

fn small_buckets(step_during_last_bucket: bool) -> DdpConfig {
    DdpConfig {
        bucket_cap_mb: 0.0005,
        first_bucket_cap_mb: 0.0002,
        step_during_last_bucket,
        ..DdpConfig::default()
    }
}

#[test]
fn the_last_bucket_is_held_and_completed_before_its_update_with_the_same_values() {
    let data = image_batches(3, WORLD * B);
    let held = run(&data, small_buckets(true), false, false);
    let plain = run(&data, small_buckets(false), false, false);
    let zero1 = run(&data, small_buckets(true), false, true);
    for rank in 0..WORLD {
        let Rank {
            params,
            log,
            buckets,
        } = &held[rank];
        // The bucket launched last, the same at every step: one of the plan's last two (the
        // stem's convolution and batch norm, whose gradients come last, each in its own).
        let holding = &log[0];
        let stem = &buckets[buckets.len() - 2..];
        assert!(
            stem.iter()
                .any(|b| *holding == format!("holding Some({b:?})")),
            "rank {rank}: {holding}, the stem's buckets {stem:?}"
        );
        let step = [holding.clone(), "held done".to_string()];
        let steps: Vec<String> = (0..3).flat_map(|_| step.clone()).collect();
        assert_eq!(*log, steps, "rank {rank}");
        // ZeRO-1 holds the same bucket: this rank steps its part of its shard last.
        assert_eq!(zero1[rank].log, *log, "rank {rank}: ZeRO-1");
        assert_eq!(
            zero1[rank].params, plain[rank].params,
            "rank {rank}: ZeRO-1"
        );
        let (plain_params, plain_log) = (&plain[rank].params, &plain[rank].log);
        assert_eq!(
            *plain_log,
            vec!["holding None".to_string(); 3],
            "rank {rank}"
        );
        let first_difference = params.iter().zip(plain_params).position(|(a, b)| a != b);
        assert_eq!(first_difference, None, "rank {rank}: held against plain");
    }
    assert_eq!(held[0].params, held[1].params, "the ranks' parameters");
}

#[test]
fn clipping_reads_every_gradient_first_so_nothing_is_held() {
    let clipped = run(
        &image_batches(3, WORLD * B),
        small_buckets(true),
        true,
        false,
    );
    for (rank, Rank { log, .. }) in clipped.iter().enumerate() {
        assert_eq!(*log, vec!["finish".to_string(); 3], "rank {rank}");
    }
}
