//! The step with a dynamic loss scaler, in f32 on the CPU: scaling by a power of two and
//! unscaling is exact, so a scaled run equals an unscaled one bit for bit; an overflowing scale
//! skips the step (parameters untouched) and halves; and the found-inf flag is reduced over
//! the ranks — with an inf injected into one rank's gradients after DDP's all-reduce (where DDP
//! itself would not spread it), both ranks skip the step and keep identical parameters.

use std::ops::Range;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use weft_collectives::{Communicator, ShmCommunicator};
use weft_models::loss::Classification;
use weft_optim::{ModelOptimizer, Sgd, SgdConfig};
use weft_parallel::{DdpConfig, DistributedDataParallel, ReadyGrads, Strategy, Trainer};
use weft_precision::{DynamicLossScaler, ScalerConfig};
use weft_tensor::{BlockModel, Checkpointing, FlatBuffer, Mode};
use weft_testing::{flat_params, tiny_resnet};

fn trainer(scale: Option<f64>) -> Trainer {
    let sgd = Sgd::<f32>::new(SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        ..SgdConfig::default()
    })
    .unwrap();
    let t = Trainer::new(
        tiny_resnet(4, 3, DType::F32),
        Box::new(Classification),
        ModelOptimizer::host_f32(sgd),
        Checkpointing::None,
    )
    .unwrap()
    .with_mode(Mode::EVAL);
    match scale {
        Some(init_scale) => t.with_loss_scaler(
            DynamicLossScaler::new(ScalerConfig {
                init_scale,
                ..ScalerConfig::default()
            })
            .unwrap(),
        ),
        None => t,
    }
}

fn batch(step: usize) -> (Tensor, Tensor) {
    let values: Vec<f32> = (0..4 * 3 * 6 * 6)
        .map(|i| ((i * 7919 + step * 13) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let x = Tensor::from_vec(values, (4, 3, 6, 6), &Device::Cpu).unwrap();
    let y = Tensor::from_vec(vec![0u32, 1, 2, (step % 3) as u32], 4, &Device::Cpu).unwrap();
    (x, y)
}

#[test]
fn a_power_of_two_scale_changes_nothing_and_an_overflow_is_skipped() {
    let mut plain = trainer(None);
    let mut scaled = trainer(Some(65536.0));
    for step in 0..3 {
        let (x, y) = batch(step);
        plain.step(&x, &y, 0.1).unwrap();
        let outcome = scaled.step(&x, &y, 0.1).unwrap();
        assert!(!outcome.skipped);
        assert_eq!(outcome.loss_scale, Some(65536.0));
    }
    assert_eq!(
        flat_params(plain.model().store()),
        flat_params(scaled.model().store())
    );
    // 2^130 times the loss overflows f32: the gradients are inf or NaN.
    let mut overflowing = trainer(Some(2f64.powi(130)));
    let before = flat_params(overflowing.model().store());
    let (x, y) = batch(0);
    let outcome = overflowing.step(&x, &y, 0.1).unwrap();
    assert!(outcome.skipped);
    assert_eq!(outcome.loss_scale, Some(2f64.powi(129)));
    assert_eq!(flat_params(overflowing.model().store()), before);
    let state = overflowing.loss_scaler_state().unwrap().unwrap();
    assert_eq!(state.skipped_steps, 1);
}

/// DDP, and on rank 1 an inf written into the averaged gradients after the all-reduce.
struct InfOnRankOne {
    inner: DistributedDataParallel,
    rank: usize,
}

impl Strategy for InfOnRankOne {
    fn name(&self) -> &'static str {
        "ddp with an inf injected on rank 1"
    }
    fn before_forward(&mut self, model: &BlockModel) -> weft_parallel::Result<()> {
        self.inner.before_forward(model)
    }
    fn block_ready(&mut self, ready: &ReadyGrads, grads: &FlatBuffer) -> weft_parallel::Result<()> {
        self.inner.block_ready(ready, grads)
    }
    fn finish_backward(&mut self, grads: &FlatBuffer) -> weft_parallel::Result<()> {
        self.inner.finish_backward(grads)?;
        if self.rank == 1 {
            let inf = Tensor::new(&[f32::INFINITY], &Device::Cpu)?;
            grads.tensor().slice_set(&inf, 0, 0)?;
        }
        Ok(())
    }
    fn set_require_sync(&mut self, sync: bool) {
        self.inner.set_require_sync(sync)
    }
    fn optimizer_range(&self, len: usize) -> Range<usize> {
        self.inner.optimizer_range(len)
    }
    fn reduce_found_inf(&mut self, local: Tensor) -> weft_parallel::Result<Tensor> {
        self.inner.reduce_found_inf(local)
    }
}

/// What one rank saw: parameters before and after the step, whether it skipped, the scale.
struct RankResult {
    before: Vec<f64>,
    after: Vec<f64>,
    skipped: bool,
    scale: Option<f64>,
}

#[test]
fn every_rank_skips_when_one_rank_finds_an_inf() {
    let comms = ShmCommunicator::new_thread_group(2).unwrap();
    let results: Vec<RankResult> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                scope.spawn(move || {
                    let comm: Arc<dyn Communicator> = Arc::new(comm);
                    let t = trainer(Some(1024.0));
                    let inner = DistributedDataParallel::new(
                        t.model(),
                        t.grads(),
                        comm,
                        DdpConfig::default(),
                    )
                    .unwrap();
                    let before = flat_params(t.model().store());
                    let mut t = t
                        .with_strategy(Box::new(InfOnRankOne { inner, rank }))
                        .unwrap();
                    let (x, y) = batch(0);
                    let rows = |t: &Tensor| t.narrow(0, rank * 2, 2).unwrap();
                    let outcome = t.step(&rows(&x), &rows(&y), 0.1).unwrap();
                    RankResult {
                        before,
                        after: flat_params(t.model().store()),
                        skipped: outcome.skipped,
                        scale: outcome.loss_scale,
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, r) in results.iter().enumerate() {
        assert!(r.skipped, "rank {rank} took the step");
        assert_eq!(r.scale, Some(512.0), "rank {rank}");
        assert_eq!(r.after, r.before, "rank {rank} changed its parameters");
    }
}
