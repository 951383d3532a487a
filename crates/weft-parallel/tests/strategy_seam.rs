//! The step's seam: the order in which the step calls its strategy (and when the host's
//! `meanwhile` work runs); DDP's
//! `find_unused_parameters` and its refusal of a gradient reported twice; tied weights
//! trained under DDP like one process; micro-batches equal to the whole batch; evaluation
//! through the graph-free path. All in f64 on thread ranks: the runs compared differ only in
//! the order of floating-point sums, so they agree to 1e-12 relative.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Tensor};
use weft_parallel::{
    DdpConfig, DistributedDataParallel, ReadyGrads, SingleProcess, Strategy, Trainer,
};
use weft_tensor::{BlockModel, FlatBuffer, Mode};
use weft_testing::{assert_close, flat_params, tied_batch, tied_model, tiny_resnet};

mod common;

const TOL: f64 = 1e-12;

fn trainer(model: BlockModel, momentum: f64) -> Trainer {
    common::sgd_classifier(model, momentum, 0.0)
}

fn rows(t: &Tensor, rank: usize, per_rank: usize) -> Tensor {
    t.narrow(0, rank * per_rank, per_rank).unwrap()
}

/// A strategy recording every call into a shared log, around a single-process strategy.
struct Recording {
    inner: SingleProcess,
    log: Arc<Mutex<Vec<String>>>,
}

impl Recording {
    fn note(&self, what: String) {
        self.log.lock().unwrap().push(what);
    }
}

impl Strategy for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }
    fn before_forward(&mut self, _model: &BlockModel) -> weft_parallel::Result<()> {
        self.note("forward".into());
        Ok(())
    }
    fn before_block_forward(
        &mut self,
        _model: &BlockModel,
        block: usize,
    ) -> weft_parallel::Result<()> {
        self.note(format!("F{block}"));
        Ok(())
    }
    fn before_block_backward(
        &mut self,
        _model: &BlockModel,
        block: usize,
    ) -> weft_parallel::Result<()> {
        self.note(format!("B{block}"));
        Ok(())
    }
    fn block_ready(&mut self, ready: &ReadyGrads, grads: &FlatBuffer) -> weft_parallel::Result<()> {
        self.note(format!("ready{}{:?}", ready.block, ready.params));
        self.inner.block_ready(ready, grads)
    }
    fn finish_backward(&mut self, grads: &FlatBuffer) -> weft_parallel::Result<()> {
        self.note("finish".into());
        self.inner.finish_backward(grads)
    }
    fn set_require_sync(&mut self, sync: bool) {
        self.note(format!("sync {sync}"));
        self.inner.set_require_sync(sync)
    }
    fn optimizer_range(&self, len: usize) -> Range<usize> {
        self.note("range".into());
        0..len
    }
    fn after_step(&mut self, _model: &BlockModel) -> weft_parallel::Result<()> {
        self.note("after step".into());
        Ok(())
    }
    fn replays_graph(&mut self, on: bool) {
        self.note(format!("replays graph {on}"));
    }
}

/// A strategy that wraps another and implements only the hooks it must.
struct Wrapping(Recording);

impl Strategy for Wrapping {
    fn name(&self) -> &'static str {
        "wrapping"
    }
    fn wrapped(&self) -> Option<&dyn Strategy> {
        Some(&self.0)
    }
    fn wrapped_mut(&mut self) -> Option<&mut dyn Strategy> {
        Some(&mut self.0)
    }
    fn block_ready(&mut self, ready: &ReadyGrads, grads: &FlatBuffer) -> weft_parallel::Result<()> {
        self.0.block_ready(ready, grads)
    }
    fn finish_backward(&mut self, grads: &FlatBuffer) -> weft_parallel::Result<()> {
        self.0.finish_backward(grads)
    }
    fn set_require_sync(&mut self, sync: bool) {
        self.0.set_require_sync(sync)
    }
}

/// A one-process trainer of the tied model whose strategy logs each call, and its log.
fn recorded_trainer() -> (Trainer, Arc<Mutex<Vec<String>>>) {
    let model = tied_model(0, DType::F64, false);
    let inner = SingleProcess::new(&model, false);
    let log = Arc::new(Mutex::new(Vec::new()));
    let strategy = Recording {
        inner,
        log: log.clone(),
    };
    let t = trainer(model, 0.0)
        .with_strategy(Box::new(strategy))
        .unwrap();
    (t, log)
}

#[test]
fn the_step_calls_its_strategy_at_every_point_in_order() {
    let (mut t, log) = recorded_trainer();
    let (x, y) = tied_batch(4, 0);
    t.step_micro_batches(&x, &y, 2, 0.1).unwrap();
    let micro = |sync: bool| {
        [
            format!("sync {sync}"),
            "forward".into(),
            "F0".into(),
            "F1".into(),
            "F2".into(),
            "B2".into(),
            "ready2[]".into(),
            "B1".into(),
            "ready1[1]".into(),
            "B0".into(),
            "ready0[0]".into(),
        ]
    };
    // The range is asked for once when the strategy is set (the master copy covers it), then
    // at every step.
    let mut expected = vec!["range".to_string()];
    expected.extend(micro(false).into_iter().chain(micro(true)));
    expected.extend(["finish", "range", "after step"].map(String::from));
    assert_eq!(*log.lock().unwrap(), expected);
}

/// Whether the step is replayed from a CUDA graph reaches the strategy a wrapper wraps (DDP
/// inside ZeRO or tensor parallelism: it moves NCCL's eager work to the compute stream).
#[test]
fn a_wrapper_passes_on_whether_the_step_is_replayed() {
    let model = tied_model(0, DType::F64, false);
    let log = Arc::new(Mutex::new(Vec::new()));
    let inner = Recording {
        inner: SingleProcess::new(&model, false),
        log: log.clone(),
    };
    let mut outer = Wrapping(inner);
    outer.replays_graph(true);
    outer.replays_graph(false);
    assert_eq!(
        *log.lock().unwrap(),
        ["replays graph true", "replays graph false"]
    );
}

/// `step_then` and `step_micro_batches_then` run the host's `meanwhile` work once per step,
/// after the step's work is issued (its update included) and before its results are read.
#[test]
fn meanwhile_runs_once_after_the_step_is_issued() {
    let (mut t, log) = recorded_trainer();
    let (x, y) = tied_batch(4, 0);
    let note = || log.lock().unwrap().push("meanwhile".to_string());
    t.step_micro_batches_then(&x, &y, (2, 0.1), &mut || note())
        .unwrap();
    t.step_then(&x, &y, 0.1, &mut || note()).unwrap();
    let log = log.lock().unwrap();
    let at: Vec<usize> = (0..log.len()).filter(|&i| log[i] == "meanwhile").collect();
    assert_eq!(at.len(), 2, "{log:?}");
    for &i in &at {
        assert_eq!(log[i - 1], "after step", "{log:?}");
    }
    assert_eq!(at[1], log.len() - 1, "{log:?}");
}

/// A step launched and finished later is the step `step` takes: launched one ahead of the
/// step being read (as the trainers do), the losses are those of plain steps, in order, and
/// `meanwhile` runs once per launch, after the step's update is issued. (On the CPU every
/// step runs when launched; a GPU's queued replays are checked by `xtask gpu-check`.)
#[test]
fn launched_steps_finished_later_equal_plain_steps() {
    let lrs = [0.1, 0.05, 0.02, 0.01];
    let batches: Vec<_> = (0..lrs.len()).map(|i| tied_batch(4, i)).collect();
    let mut plain = trainer(tied_model(0, DType::F64, false), 0.9);
    let expected: Vec<f64> = batches
        .iter()
        .zip(lrs)
        .map(|((x, y), lr)| plain.step(x, y, lr).unwrap().loss)
        .collect();

    let (mut t, log) = recorded_trainer();
    let mut ahead = trainer(tied_model(0, DType::F64, false), 0.9);
    let mut losses = Vec::new();
    let mut in_flight = None;
    for ((x, y), lr) in batches.iter().zip(lrs) {
        let launched = ahead.launch(x, y, (1, lr)).unwrap();
        assert!(!launched.is_queued(), "a CPU step runs when launched");
        if let Some(earlier) = in_flight.replace(launched) {
            losses.push(ahead.finish(earlier).unwrap().loss);
        }
    }
    losses.push(ahead.finish(in_flight.unwrap()).unwrap().loss);
    assert_eq!(losses, expected);

    let (x, y) = tied_batch(4, 0);
    let note = || log.lock().unwrap().push("meanwhile".to_string());
    let launched = t.launch_then(&x, &y, (2, 0.1), &mut || note()).unwrap();
    t.finish(launched).unwrap();
    let log = log.lock().unwrap();
    let at: Vec<usize> = (0..log.len()).filter(|&i| log[i] == "meanwhile").collect();
    assert_eq!(at, [log.len() - 1], "{log:?}");
    assert_eq!(log[at[0] - 1], "after step", "{log:?}");
}

#[test]
fn a_gradient_reported_twice_is_an_error_naming_it() {
    let model = tied_model(0, DType::F64, false);
    let t = trainer(tied_model(0, DType::F64, false), 0.0);
    let ready = ReadyGrads {
        block: 1,
        params: vec![1],
        unused: vec![],
    };
    let mut single = SingleProcess::new(&model, false);
    single.block_ready(&ready, t.grads()).unwrap();
    let err = single
        .block_ready(&ready, t.grads())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`middle.weight`") && err.contains("twice"),
        "{err}"
    );
    let errors = weft_testing::on_thread_ranks(2, |_, comm| {
        let t = trainer(tied_model(0, DType::F64, false), 0.0);
        let mut ddp =
            DistributedDataParallel::new(t.model(), t.grads(), comm, DdpConfig::default()).unwrap();
        ddp.block_ready(&ready, t.grads()).unwrap();
        ddp.block_ready(&ready, t.grads()).unwrap_err().to_string()
    });
    for err in errors {
        assert!(
            err.contains("`middle.weight`") && err.contains("twice"),
            "{err}"
        );
    }
}

#[test]
fn ddp_with_find_unused_parameters_trains_like_one_process() {
    // `middle.unused` never enters the loss: reduced as zero, so (SGD, no decay) it keeps its
    // value, and every other parameter trains exactly as in one process on the global batch.
    let per_rank = 2;
    let steps = 3;
    let single = trainer(tied_model(0, DType::F64, true), 0.9);
    let accepting = SingleProcess::new(single.model(), true);
    let mut single = single.with_strategy(Box::new(accepting)).unwrap();
    let before = flat_params(single.model().store());
    for step in 0..steps {
        let (x, y) = tied_batch(2 * per_rank, step);
        single.step(&x, &y, 0.1).unwrap();
    }
    let reference = flat_params(single.model().store());
    let unused = single.model().store().get("middle.unused").unwrap();
    assert_eq!(unused.tensor().dims(), [1, 3]);
    let results = weft_testing::on_thread_ranks(2, |rank, comm| {
        let t = trainer(tied_model(0, DType::F64, true), 0.9);
        let config = DdpConfig {
            find_unused_parameters: true,
            bucket_cap_mb: 0.0001,
            first_bucket_cap_mb: 0.0001,
            ..DdpConfig::default()
        };
        let ddp = DistributedDataParallel::new(t.model(), t.grads(), comm, config).unwrap();
        let mut t = t.with_strategy(Box::new(ddp)).unwrap();
        for step in 0..steps {
            let (x, y) = tied_batch(2 * per_rank, step);
            t.step(&rows(&x, rank, per_rank), &rows(&y, rank, per_rank), 0.1)
                .unwrap();
        }
        flat_params(t.model().store())
    });
    for (rank, params) in results.iter().enumerate() {
        assert_close(params, &reference, TOL, &format!("rank {rank}"));
    }
    // The unused parameter is the last 3 elements of the flat parameters.
    let n = before.len();
    assert_eq!(reference[n - 3..], before[n - 3..]);
    assert_ne!(reference[..n - 3], before[..n - 3]);
}

#[test]
fn tied_weights_train_under_ddp_like_one_process() {
    let per_rank = 3;
    let mut single = trainer(tied_model(1, DType::F64, false), 0.9);
    for step in 0..3 {
        let (x, y) = tied_batch(2 * per_rank, step);
        single.step(&x, &y, 0.1).unwrap();
    }
    let reference = flat_params(single.model().store());
    let results = weft_testing::on_thread_ranks(2, |rank, comm| {
        let t = trainer(tied_model(1, DType::F64, false), 0.9);
        let ddp =
            DistributedDataParallel::new(t.model(), t.grads(), comm, DdpConfig::default()).unwrap();
        let mut t = t.with_strategy(Box::new(ddp)).unwrap();
        for step in 0..3 {
            let (x, y) = tied_batch(2 * per_rank, step);
            t.step(&rows(&x, rank, per_rank), &rows(&y, rank, per_rank), 0.1)
                .unwrap();
        }
        flat_params(t.model().store())
    });
    for (rank, params) in results.iter().enumerate() {
        assert_close(params, &reference, TOL, &format!("tied, rank {rank}"));
    }
}

#[test]
fn micro_batches_equal_the_whole_batch_and_evaluation_matches_the_step_loss() {
    let x = Tensor::randn(0f64, 1.0, (4, 3, 6, 6), &Device::Cpu).unwrap();
    let y = Tensor::new(&[0u32, 1, 2, 1], &Device::Cpu).unwrap();
    // Evaluation-mode BatchNorm: splitting the batch does not change the statistics.
    let mut whole = trainer(tiny_resnet(3, 3, DType::F64), 0.9).with_mode(Mode::EVAL);
    let mut split = trainer(tiny_resnet(3, 3, DType::F64), 0.9).with_mode(Mode::EVAL);
    let eval = whole.evaluate(&x, &y).unwrap();
    let first = whole.step(&x, &y, 0.1).unwrap();
    assert!((eval.loss_sum / 4.0 - first.loss).abs() <= TOL * first.loss);
    assert_eq!(eval.samples, 4);
    split.step_micro_batches(&x, &y, 2, 0.1).unwrap();
    whole.step(&x, &y, 0.1).unwrap();
    split.step_micro_batches(&x, &y, 4, 0.1).unwrap();
    assert_close(
        &flat_params(split.model().store()),
        &flat_params(whole.model().store()),
        TOL,
        "micro-batches",
    );
    let err = split
        .step_micro_batches(&x, &y, 3, 0.1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("3 micro-batches"), "{err}");
}
