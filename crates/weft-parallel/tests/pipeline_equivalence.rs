//! Pipeline parallelism against one process: the GPT cut into P = 2 and 4 stages (thread ranks
//! over the shared-memory backend), trained under GPipe and 1F1B with M = 1, P and 2P
//! micro-batches, ends with the parameters of the whole model trained on the whole batch, in
//! f64 within 1e-10 relative. The two runs differ only in the order of sums: the micro-batches'
//! gradients accumulated one by one instead of summed inside one backward, and the tied token
//! table's two parts (embedding and head) summed across stages. LayerNorm makes micro-batching
//! exact; gradient clipping is on (at a norm it reaches), so the norm reduced over the stages,
//! with the table counted once, is checked too. Each stage's measured peak of micro-batches in
//! flight is the plan's: M under GPipe, min(P − s, M) under 1F1B. An inf found on one stage
//! makes every stage skip the step.

use std::ops::Range;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use weft_collectives::Communicator;
use weft_models::gpt::{gpt, gpt_stage, Dense, GptConfig};
use weft_models::loss::NextToken;
use weft_optim::{ModelOptimizer, Sgd, SgdConfig};
use weft_parallel::pipeline::{
    measured_block_times, partition, PipelineStage, PipelineTrainer, Plan, ScheduleKind,
};
use weft_parallel::{ReadyGrads, SingleProcess, Strategy, Trainer};
use weft_precision::{DynamicLossScaler, ScalerConfig};
use weft_tensor::{BlockModel, Checkpointing, FlatBuffer, Objective};
use weft_testing::on_thread_ranks;

const BATCH: usize = 8;
const STEPS: usize = 3;
const LR: f64 = 0.5;
const CLIP: f64 = 0.5;

fn config() -> GptConfig {
    let mut config = GptConfig::from_name("gpt-tiny").unwrap().with_seed(9);
    (config.vocab_size, config.vocab_multiple, config.n_embd) = (13, 8, 16);
    (config.n_head, config.n_layer, config.context) = (4, 2, 8);
    config
}

/// Step `s`'s token batch and its next-token targets.
fn batch(step: usize) -> (Tensor, Tensor) {
    let s = step as u32;
    let v: Vec<u32> = (0..(BATCH * 9) as u32)
        .map(|i| (i * 7 + s * 5 + i * i / 3) % 13)
        .collect();
    let all = Tensor::from_vec(v, (BATCH, 9), &Device::Cpu).unwrap();
    (all.narrow(1, 0, 8).unwrap(), all.narrow(1, 1, 8).unwrap())
}

fn trainer(model: BlockModel) -> Trainer {
    let sgd = Sgd::<f64>::new(SgdConfig {
        lr: LR,
        momentum: 0.9,
        weight_decay: 1e-2,
        ..SgdConfig::default()
    })
    .unwrap();
    let objective = Box::new(NextToken { vocab_size: 13 });
    Trainer::new(
        model,
        objective,
        ModelOptimizer::host_f64(sgd),
        Checkpointing::None,
    )
    .unwrap()
    .with_clip_grad_norm(CLIP)
    .unwrap()
}

/// `(name, values)` of every parameter, and the losses of each step.
type Trained = (Vec<(String, Vec<f64>)>, Vec<f64>);

fn named_values(model: &BlockModel) -> Vec<(String, Vec<f64>)> {
    model
        .store()
        .entries()
        .iter()
        .map(|e| {
            let v = e.tensor().flatten_all().unwrap().to_vec1::<f64>().unwrap();
            (e.name.clone(), v)
        })
        .collect()
}

fn one_process() -> Trained {
    let mut t = trainer(gpt(&config(), DType::F64, &Device::Cpu).unwrap());
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (x, y) = batch(step);
        let out = t.step(&x, &y, LR).unwrap();
        assert!(out.metric("grad_norm") > CLIP, "clipping must act");
        losses.push(out.loss);
    }
    (named_values(t.model()), losses)
}

/// Stage `comm.rank()` of the cut `stages`, trained under `schedule` with `m` micro-batches;
/// also checks its peak of micro-batches in flight against the plan.
fn stage(
    comm: Arc<dyn Communicator>,
    stages: &[Range<usize>],
    schedule: ScheduleKind,
    m: usize,
) -> Trained {
    let s = comm.rank();
    let model = gpt_stage(
        &config(),
        DType::F64,
        &Device::Cpu,
        &Dense,
        stages[s].clone(),
    )
    .unwrap();
    let plain = trainer(model);
    let tied = plain
        .model()
        .store()
        .id("transformer.wte.weight")
        .ok()
        .and_then(|id| plain.grads().layout().slot_of(id).map(|slot| slot.range()));
    let inner = Box::new(SingleProcess::new(plain.model(), false));
    let strategy = PipelineStage::new(inner, comm.clone(), tied).unwrap();
    let plain = plain.with_strategy(Box::new(strategy)).unwrap();
    let mut t = PipelineTrainer::new(plain, comm.clone(), schedule, m).unwrap();
    let peak = Plan::new(schedule, stages.len(), m).peak_in_flight(s);
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (x, y) = batch(step);
        let out = t.step(Some(&x), Some(&y), LR).unwrap();
        assert_eq!(out.peak_in_flight, peak, "stage {s}");
        assert!(out.step.metric("grad_norm") > CLIP);
        losses.push(out.step.loss);
    }
    (named_values(t.trainer().model()), losses)
}

fn assert_matches(ours: &Trained, reference: &Trained, what: &str) {
    let (params, losses) = ours;
    let whole: std::collections::HashMap<_, _> = reference.0.iter().cloned().collect();
    for (name, values) in params {
        weft_testing::assert_close(values, &whole[name], 1e-10, &format!("{what}: {name}"));
    }
    weft_testing::assert_close(losses, &reference.1, 1e-10, &format!("{what}: losses"));
}

#[test]
fn pipelines_equal_one_process_in_f64() {
    let reference = one_process();
    let counts = config().block_parameter_counts();
    for p in [2, 4] {
        let stages = partition::balanced(&counts, p).unwrap();
        for schedule in [ScheduleKind::GPipe, ScheduleKind::OneFOneB] {
            for m in [1, p, 2 * p] {
                let what = format!("P {p} {schedule:?} M {m}");
                let trained = on_thread_ranks(p, |_, comm| stage(comm, &stages, schedule, m));
                for (s, ours) in trained.iter().enumerate() {
                    assert_matches(ours, &reference, &format!("{what} stage {s}"));
                }
                let names: usize = trained.iter().map(|(p, _)| p.len()).sum();
                assert_eq!(names, reference.0.len() + 1, "{what}: the table twice");
            }
        }
    }
}

/// One process's strategy with an inf written into the gradients on the last stage only.
struct InfOnLastStage {
    inner: SingleProcess,
    last: bool,
}

impl Strategy for InfOnLastStage {
    fn name(&self) -> &'static str {
        "single with an inf on the last stage"
    }
    fn block_ready(&mut self, ready: &ReadyGrads, grads: &FlatBuffer) -> weft_parallel::Result<()> {
        self.inner.block_ready(ready, grads)
    }
    fn finish_backward(&mut self, grads: &FlatBuffer) -> weft_parallel::Result<()> {
        self.inner.finish_backward(grads)?;
        if self.last {
            let inf = Tensor::new(&[f32::INFINITY], &Device::Cpu)?;
            grads.tensor().slice_set(&inf, 0, 0)?;
        }
        Ok(())
    }
    fn set_require_sync(&mut self, sync: bool) {
        self.inner.set_require_sync(sync)
    }
}

/// With a loss scaler on every stage, an inf in the last stage's gradients makes every stage
/// skip the step (its parameters untouched) and halve its scale: the found-inf flag is the
/// maximum over the stages.
#[test]
fn every_stage_skips_when_one_stage_finds_an_inf() {
    let results = on_thread_ranks(2, |s, comm| {
        let blocks = [0..3, 3..6][s].clone();
        let model = gpt_stage(&config(), DType::F32, &Device::Cpu, &Dense, blocks).unwrap();
        let sgd = Sgd::<f32>::new(SgdConfig {
            lr: LR,
            ..SgdConfig::default()
        })
        .unwrap();
        let scaler = DynamicLossScaler::new(ScalerConfig {
            init_scale: 1024.0,
            ..ScalerConfig::default()
        })
        .unwrap();
        let plain = Trainer::new(
            model,
            Box::new(NextToken { vocab_size: 13 }),
            ModelOptimizer::host_f32(sgd),
            Checkpointing::None,
        )
        .unwrap()
        .with_loss_scaler(scaler);
        let tied = plain
            .model()
            .store()
            .id("transformer.wte.weight")
            .ok()
            .and_then(|id| plain.grads().layout().slot_of(id).map(|slot| slot.range()));
        let inner = InfOnLastStage {
            inner: SingleProcess::new(plain.model(), false),
            last: s == 1,
        };
        let strategy = PipelineStage::new(Box::new(inner), comm.clone(), tied).unwrap();
        let plain = plain.with_strategy(Box::new(strategy)).unwrap();
        let before = weft_testing::flat_params(plain.model().store());
        let mut t = PipelineTrainer::new(plain, comm, ScheduleKind::OneFOneB, 2).unwrap();
        let (x, y) = batch(0);
        let out = t.step(Some(&x), Some(&y), LR).unwrap();
        let after = weft_testing::flat_params(t.trainer().model().store());
        (before == after, out.step.skipped, out.step.loss_scale)
    });
    for (s, (unchanged, skipped, scale)) in results.into_iter().enumerate() {
        assert!(unchanged && skipped, "stage {s} stepped");
        assert_eq!(scale, Some(512.0), "stage {s}");
    }
}

/// Measured block times (the weights of `--pp-balance time`) come one per block, each at least
/// a microsecond, and cut like any weights; what they are is timing, left to the benchmarks.
#[test]
fn measured_block_times_weigh_every_block() {
    let model = gpt(&config(), DType::F32, &Device::Cpu).unwrap();
    let (x, y) = batch(0);
    let objective = NextToken { vocab_size: 13 };
    let loss = |out: &Tensor| Ok(objective.loss(out, &y)?.loss);
    let times = measured_block_times(&model, &x, loss, 2).unwrap();
    assert_eq!(times.len(), model.blocks().len());
    assert!(times.iter().all(|&t| t >= 1), "{times:?}");
    let cuts = partition::balanced(&times, 2).unwrap();
    assert_eq!(cuts.last().unwrap().end, times.len());
}
