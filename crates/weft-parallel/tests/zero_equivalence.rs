//! ZeRO against single-process training: N ranks (threads over the shared-memory backend) with
//! per-rank batch B, each stepping only its shard of the flat buffers and all-gathering the
//! updated parameters, end with the parameters of one process trained on the N·B samples.
//! AdamW with param groups (no weight decay and half the learning rate on 1-D parameters), so
//! shards that cut through a group, or through a parameter, are exercised. BatchNorm runs in
//! evaluation mode (every rank normalises alike), so the runs differ only in the order of the
//! f64 gradient sums: 1e-10 relative after several steps (the ZeRO variants against the naive
//! reference, the reference against one process). Every rank starts from another
//! initialisation, which the strategy replaces with rank 0's; each rank's master copy and
//! optimizer state cover its shard only.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use weft_collectives::Communicator;
use weft_models::loss::Classification;
use weft_optim::{AdamWConfig, ModelOptimizer, OptimizerConfig, ParamGroup, ParamGroups};
use weft_parallel::zero::{naive_zero, zero_stage1, zero_stage2, zero_stage3, ShardLayout};
use weft_parallel::{DdpConfig, Strategy, Trainer};
use weft_tensor::{Checkpointing, FlatLayout, Mode};
use weft_testing::{assert_close, flat_params, image_batches, on_thread_ranks, tiny_resnet};

const B: usize = 2;
const STEPS: usize = 3;

fn groups(model: &weft_tensor::BlockModel) -> ParamGroups {
    let layout = FlatLayout::parameters(model.store());
    let one_dimensional = layout.slots().iter().filter(|s| s.shape.len() == 1);
    ParamGroups::new(
        one_dimensional
            .map(|slot| ParamGroup {
                range: slot.range(),
                weight_decay: 0.0,
                lr_scale: 0.5,
            })
            .collect(),
    )
    .unwrap()
}

fn trainer(seed: u64, clip: Option<f64>) -> Trainer {
    let model = tiny_resnet(seed, 3, DType::F64);
    let config = OptimizerConfig::AdamW(AdamWConfig {
        lr: 0.01,
        weight_decay: 0.05,
        ..AdamWConfig::default()
    });
    let optimizer = ModelOptimizer::new(config, groups(&model), &Device::Cpu, DType::F64).unwrap();
    let t = Trainer::new(
        model,
        Box::new(Classification),
        optimizer,
        Checkpointing::None,
    )
    .unwrap()
    .with_mode(Mode::EVAL);
    match clip {
        Some(norm) => t.with_clip_grad_norm(norm).unwrap(),
        None => t,
    }
}

type MakeStrategy = dyn Fn(&Trainer, Arc<dyn Communicator>) -> Box<dyn Strategy> + Sync;

/// Every rank's parameters, and the lengths of its master copy and optimizer state, after
/// training on its rows of each batch, in `micro` micro-batches.
fn run_ranks(
    world: usize,
    data: &[(Tensor, Tensor)],
    (micro, clip): (usize, Option<f64>),
    make: &MakeStrategy,
) -> Vec<(Vec<f64>, usize, usize)> {
    on_thread_ranks(world, |rank, comm| {
        // Another initialisation on every other rank: the strategy broadcasts rank 0's.
        let plain = trainer(rank as u64, clip);
        let strategy = make(&plain, comm);
        let mut t = plain.with_strategy(strategy).unwrap();
        let per_rank = data[0].1.elem_count() / world;
        let per_micro = per_rank / micro;
        for (x, y) in data {
            let parts: Vec<(Tensor, Tensor)> = (0..micro)
                .map(|m| {
                    let start = rank * per_rank + m * per_micro;
                    let mine = |t: &Tensor| t.narrow(0, start, per_micro).unwrap();
                    (mine(x), mine(y))
                })
                .collect();
            t.step_accumulated(&parts, 0.01).unwrap();
        }
        let master = t.master_weights().unwrap().map_or(0, |m| m.elem_count());
        let params = t
            .with_full_parameters(|model| Ok(flat_params(model.store())))
            .unwrap();
        (params, master, t.optimizer().unwrap().state_len())
    })
}

fn single_process(data: &[(Tensor, Tensor)], clip: Option<f64>) -> (Vec<f64>, usize, usize) {
    let mut t = trainer(0, clip);
    for (x, y) in data {
        t.step(x, y, 0.01).unwrap();
    }
    let master = t.master_weights().unwrap().map_or(0, |m| m.elem_count());
    (
        flat_params(t.model().store()),
        master,
        t.optimizer().unwrap().state_len(),
    )
}

fn small_buckets() -> DdpConfig {
    DdpConfig {
        bucket_cap_mb: 0.0005,
        first_bucket_cap_mb: 0.0002,
        ..DdpConfig::default()
    }
}

fn check(world: usize, micro: usize, clip: Option<f64>) {
    let data = image_batches(STEPS, world * B);
    let (reference, full_master, full_state) = single_process(&data, clip);
    let naive = run_ranks(world, &data, (micro, clip), &|t, comm| {
        Box::new(naive_zero(t.model(), t.grads(), comm, false).unwrap())
    });
    let stage1 = run_ranks(world, &data, (micro, clip), &|t, comm| {
        Box::new(zero_stage1(t.model(), t.grads(), comm, small_buckets()).unwrap())
    });
    let stage2 = run_ranks(world, &data, (micro, clip), &|t, comm| {
        Box::new(zero_stage2(t.model(), t.grads(), comm, small_buckets()).unwrap())
    });
    let stage3 = run_ranks(world, &data, (micro, clip), &|t, comm| {
        Box::new(zero_stage3(t.model(), t.grads(), comm, small_buckets()).unwrap())
    });
    for rank in 0..world {
        let what =
            |name| format!("{name}, world {world}, micro {micro}, clip {clip:?}, rank {rank}");
        assert_eq!(
            full_state,
            2 * full_master,
            "one process: AdamW's two moments"
        );
        assert_close(&naive[rank].0, &reference, 1e-10, &what("naive"));
        assert_close(&stage1[rank].0, &naive[rank].0, 1e-10, &what("stage 1"));
        assert_close(&stage2[rank].0, &naive[rank].0, 1e-10, &what("stage 2"));
        assert_close(&stage3[rank].0, &naive[rank].0, 1e-10, &what("stage 3"));
        // The master copy and AdamW's two moments over this rank's shard only.
        let shard = ShardLayout::new(full_master, world).range(rank).len();
        for (name, run) in [
            ("naive", &naive),
            ("stage 1", &stage1),
            ("stage 2", &stage2),
            ("stage 3", &stage3),
        ] {
            let (_, master, state) = run[rank];
            assert_eq!(master, shard, "{}: master copy", what(name));
            assert_eq!(state, 2 * shard, "{}: optimizer state", what(name));
        }
    }
}

#[test]
fn zero_stages_match_one_process_on_the_global_batch() {
    for world in [1, 2, 4] {
        check(world, 1, None);
    }
}

#[test]
fn zero_with_micro_batches_and_clipping_matches_one_process() {
    check(2, 2, Some(0.05));
}
