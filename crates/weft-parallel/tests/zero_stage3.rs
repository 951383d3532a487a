//! ZeRO stage 3's own promises, on 2 thread ranks in f64 (runs compared differ only in the
//! order of gradient sums: 1e-12 relative):
//! - a rank's variables hold only the parameters of the block that runs (its own gather in
//!   flight aside) at every point of a step, none between steps, and the shard always;
//! - tied weights (a head that reuses the embedding, trained through Candle's autograd, whose
//!   graph reads the released-then-gathered table) train like one process;
//! - evaluation gathers block by block and gives one process's loss, then releases;
//! - `with_full_parameters` writes back what is written into the whole model.

use std::sync::{Arc, Mutex};

use candle_core::{DType, Tensor};
use weft_collectives::Communicator;
use weft_parallel::zero::{zero_stage3, zero_stage3_from_shard, ShardLayout};
use weft_parallel::{DdpConfig, ReadyGrads, Strategy, Trainer};
use weft_tensor::sharded_init::ShardedInit;
use weft_tensor::{residency, BlockModel, EntryId, FlatBuffer, Mode};
use weft_testing::{
    assert_close, flat_params, on_thread_ranks, tied_batch, tied_model, tiny_resnet,
};

mod common;

const TOL: f64 = 1e-12;

fn trainer(model: BlockModel) -> Trainer {
    common::sgd_classifier(model, 0.9, 0.0).with_mode(Mode::EVAL)
}

fn stage3(t: Trainer, comm: Arc<dyn Communicator>) -> Trainer {
    let strategy = zero_stage3(t.model(), t.grads(), comm, DdpConfig::default()).unwrap();
    t.with_strategy(Box::new(strategy)).unwrap()
}

fn bytes_of(model: &BlockModel, entries: &[EntryId]) -> usize {
    entries
        .iter()
        .map(|&id| model.store().entries()[id].tensor().elem_count() * 8)
        .sum()
}

fn resident(model: &BlockModel) -> usize {
    let store = model.store();
    store
        .parameter_ids()
        .into_iter()
        .map(|id| residency::resident_bytes(store.entries()[id].tensor()))
        .sum()
}

/// Around stage 3: after each of its calls, the bytes the model's variables hold and the most
/// they may hold then.
struct Measured {
    inner: Box<dyn Strategy>,
    log: Arc<Mutex<Vec<(String, usize, usize)>>>,
}

impl Measured {
    fn note(&self, at: String, model: &BlockModel, bound: usize) {
        self.log.lock().unwrap().push((at, resident(model), bound));
    }
}

impl Strategy for Measured {
    fn name(&self) -> &'static str {
        "measured"
    }
    fn wrapped(&self) -> Option<&dyn Strategy> {
        Some(self.inner.as_ref())
    }
    fn wrapped_mut(&mut self) -> Option<&mut dyn Strategy> {
        Some(self.inner.as_mut())
    }
    fn before_forward(&mut self, model: &BlockModel) -> weft_parallel::Result<()> {
        self.inner.before_forward(model)?;
        self.note("before forward".into(), model, 0);
        Ok(())
    }
    fn before_block_forward(&mut self, model: &BlockModel, b: usize) -> weft_parallel::Result<()> {
        self.inner.before_block_forward(model, b)?;
        let bound = bytes_of(model, model.parameters_used_by(b));
        self.note(format!("forward {b}"), model, bound);
        Ok(())
    }
    fn before_block_backward(&mut self, model: &BlockModel, b: usize) -> weft_parallel::Result<()> {
        self.inner.before_block_backward(model, b)?;
        let bound = bytes_of(model, model.parameters_used_by(b));
        self.note(format!("backward {b}"), model, bound);
        Ok(())
    }
    fn block_ready(&mut self, ready: &ReadyGrads, grads: &FlatBuffer) -> weft_parallel::Result<()> {
        self.inner.block_ready(ready, grads)
    }
    fn finish_backward(&mut self, grads: &FlatBuffer) -> weft_parallel::Result<()> {
        self.inner.finish_backward(grads)
    }
    fn set_require_sync(&mut self, sync: bool) {
        self.inner.set_require_sync(sync)
    }
    fn before_update(&mut self, model: &BlockModel) -> weft_parallel::Result<()> {
        self.inner.before_update(model)?;
        // The entries that hold this rank's shard, whole.
        let range = self.inner.optimizer_range(resident_len(model));
        let layout = weft_tensor::FlatLayout::parameters(model.store());
        let own: Vec<EntryId> = layout
            .slots()
            .iter()
            .filter(|s| s.offset < range.end && range.start < s.offset + s.numel())
            .map(|s| s.entry)
            .collect();
        self.note("update".into(), model, bytes_of(model, &own));
        Ok(())
    }
    fn after_step(&mut self, model: &BlockModel) -> weft_parallel::Result<()> {
        self.inner.after_step(model)?;
        self.note("after step".into(), model, 0);
        Ok(())
    }
}

fn shard_bytes(t: &Trainer) -> usize {
    let shard = t
        .strategy()
        .parameter_shard()
        .expect("stage 3 keeps a shard");
    shard.elem_count() * shard.dtype().size_in_bytes()
}

fn resident_len(model: &BlockModel) -> usize {
    model.store().num_parameters()
}

#[test]
fn a_rank_holds_the_running_block_and_its_shard_only() {
    let data = weft_testing::image_batches(2, 4);
    let logs = on_thread_ranks(2, |rank, comm| {
        let t = trainer(tiny_resnet(0, 3, DType::F64));
        let whole = bytes_of(t.model(), &t.model().store().parameter_ids());
        let inner = zero_stage3(t.model(), t.grads(), comm, DdpConfig::default()).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let strategy = Measured {
            inner: Box::new(inner),
            log: log.clone(),
        };
        let mut t = t.with_strategy(Box::new(strategy)).unwrap();
        for (x, y) in &data {
            t.step(
                &x.narrow(0, rank * 2, 2).unwrap(),
                &y.narrow(0, rank * 2, 2).unwrap(),
                0.1,
            )
            .unwrap();
        }
        let shard = shard_bytes(&t);
        let states = t.model_state_bytes();
        let log = log.lock().unwrap().clone();
        (log, whole, shard, states.parameters)
    });
    for (rank, (log, whole, shard, parameters)) in logs.into_iter().enumerate() {
        let elements = whole / 8;
        let own = elements
            .div_ceil(2)
            .min(elements - rank * elements.div_ceil(2));
        assert_eq!(shard, own * 8, "rank {rank}: the shard");
        assert_eq!(
            parameters, shard,
            "rank {rank}: between steps only the shard"
        );
        let blocks = tiny_resnet(0, 3, DType::F64).blocks().len();
        assert_eq!(
            log.len(),
            2 * (1 + 2 * blocks + 2),
            "rank {rank}: every point logged"
        );
        // Exactly the running block's parameters (a prefetched gather is written only when
        // its block runs), the shard's variables at the update, nothing otherwise.
        for (at, held, bound) in &log {
            assert_eq!(held, bound, "rank {rank}, {at}: bytes held");
        }
        let peak = log.iter().map(|(_, held, _)| *held).max().unwrap();
        assert!(
            peak < whole,
            "rank {rank}: peak {peak} of the whole {whole}"
        );
    }
}

#[test]
fn a_model_built_as_shards_never_whole_trains_like_one_process() {
    let data = weft_testing::image_batches(3, 4);
    let mut single = trainer(tiny_resnet(0, 3, DType::F64));
    for (x, y) in &data {
        single.step(x, y, 0.1).unwrap();
    }
    let reference = flat_params(single.model().store());
    let results = on_thread_ranks(2, |rank, comm| {
        let build = || weft_tensor::Result::Ok(tiny_resnet(0, 3, DType::F64));
        let (_, len) = ShardedInit::count(build).unwrap();
        let window = ShardLayout::new(len, 2).range(rank);
        let (model, shard) = ShardedInit::capture(window, build).unwrap();
        // Built, no parameter is whole on any rank.
        let held_after_build = resident(&model);
        let t = trainer(model);
        // No gradient buffer until the strategy says which part this rank keeps.
        let gradients_before = t.model_state_bytes().gradients;
        let strategy =
            zero_stage3_from_shard(t.model(), t.grads(), comm, DdpConfig::default(), shard)
                .unwrap();
        let mut t = t.with_strategy(Box::new(strategy)).unwrap();
        assert_eq!(
            gradients_before, 0,
            "rank {rank}: gradients before the strategy"
        );
        let shard_bytes = ShardLayout::new(t.grads().layout().len(), 2)
            .range(rank)
            .len()
            * 8;
        assert_eq!(t.model_state_bytes().gradients, shard_bytes, "rank {rank}");
        for (x, y) in &data {
            let rows = |t: &Tensor| t.narrow(0, rank * 2, 2).unwrap();
            t.step(&rows(x), &rows(y), 0.1).unwrap();
        }
        let params = t
            .with_full_parameters(|model| Ok(flat_params(model.store())))
            .unwrap();
        (held_after_build, params)
    });
    for (rank, (held, params)) in results.into_iter().enumerate() {
        assert_eq!(held, 0, "rank {rank}: parameters held after the build");
        assert_close(
            &params,
            &reference,
            TOL,
            &format!("sharded init, rank {rank}"),
        );
    }
}

#[test]
fn a_model_built_as_shards_needs_its_shard() {
    let errors = on_thread_ranks(2, |rank, comm| {
        let build = || weft_tensor::Result::Ok(tiny_resnet(0, 3, DType::F64));
        let window = ShardLayout::new(ShardedInit::count(build).unwrap().1, 2).range(rank);
        let (model, _) = ShardedInit::capture(window, build).unwrap();
        let t = trainer(model);
        let config = DdpConfig::default();
        match zero_stage3(t.model(), t.grads(), comm, config) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    });
    for err in errors {
        assert!(err.contains("sharded initialisation"), "{err}");
    }
}

#[test]
fn tied_weights_train_under_stage3_like_one_process_and_evaluate_alike() {
    let per_rank = 3;
    let mut single = trainer(tied_model(1, DType::F64, false));
    for step in 0..3 {
        let (x, y) = tied_batch(2 * per_rank, step);
        single.step(&x, &y, 0.1).unwrap();
    }
    let (x, y) = tied_batch(2 * per_rank, 7);
    let eval = single.evaluate(&x, &y).unwrap();
    let reference = flat_params(single.model().store());
    let results = on_thread_ranks(2, |rank, comm| {
        let mut t = stage3(trainer(tied_model(1, DType::F64, false)), comm);
        for step in 0..3 {
            let (x, y) = tied_batch(2 * per_rank, step);
            let rows = |t: &Tensor| t.narrow(0, rank * per_rank, per_rank).unwrap();
            t.step(&rows(&x), &rows(&y), 0.1).unwrap();
        }
        let eval = t.evaluate(&x, &y).unwrap();
        let released = t.model_state_bytes().parameters == shard_bytes(&t);
        let params = t
            .with_full_parameters(|model| Ok(flat_params(model.store())))
            .unwrap();
        (params, eval.loss_sum, released)
    });
    for (rank, (params, loss_sum, released)) in results.into_iter().enumerate() {
        assert_close(&params, &reference, TOL, &format!("tied, rank {rank}"));
        assert_close(
            &[loss_sum],
            &[eval.loss_sum],
            TOL,
            &format!("evaluation, rank {rank}"),
        );
        assert!(released, "rank {rank}: evaluation released the parameters");
    }
}

#[test]
fn what_is_written_into_the_whole_model_is_kept() {
    let results = on_thread_ranks(2, |rank, comm| {
        let mut t = stage3(trainer(tied_model(1, DType::F64, false)), comm);
        let (x, y) = tied_batch(4, 0);
        let rows = |t: &Tensor| t.narrow(0, rank * 2, 2).unwrap();
        t.step(&rows(&x), &rows(&y), 0.1).unwrap();
        // Every rank sets the middle layer to ones, as a loaded checkpoint would.
        t.with_full_parameters(|model| {
            let store = model.store();
            let middle = &store.get("middle.weight").unwrap().var;
            middle.set(&middle.ones_like().unwrap()).unwrap();
            Ok(())
        })
        .unwrap();
        t.with_full_parameters(|model| Ok(flat_params(model.store())))
            .unwrap()
    });
    for (rank, params) in results.iter().enumerate() {
        // embed 6x4, then middle 6x6.
        assert!(params[24..60].iter().all(|&v| v == 1.0), "rank {rank}");
        assert_eq!(params, &results[0], "rank {rank} equals rank 0");
    }
}
