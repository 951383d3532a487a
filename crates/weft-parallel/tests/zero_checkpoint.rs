//! Sharded checkpoints: a ZeRO run of 4 ranks (stage 1, and stage 3, whose shard files hold
//! the parameters too) saves its shards mid-training; the checkpoint is loaded by 2 ranks
//! (ZeRO-2 and ZeRO-3), by one process, and through its full state dict (exported, then
//! imported by 2 ranks), and every run continues to the parameters the 4 ranks reach (the same
//! global batches; f64, so only the order of the gradient sums differs: 1e-10 relative).
//! Every loading run starts from another initialisation, which the checkpoint replaces.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use weft_collectives::Communicator;
use weft_models::loss::Classification;
use weft_optim::{AdamWConfig, ModelOptimizer, OptimizerConfig, ParamGroups};
use weft_parallel::zero::checkpoint::{load_sharded, save_sharded};
use weft_parallel::zero::full_state::{export_full_model, export_full_state, import_full_state};
use weft_parallel::zero::{zero_stage1, zero_stage2, zero_stage3, ShardLayout};
use weft_parallel::{DdpConfig, Strategy, Trainer};
use weft_tensor::{Checkpointing, Mode};
use weft_testing::{assert_close, flat_params, image_batches, on_thread_ranks, tiny_resnet};

const GLOBAL_BATCH: usize = 8;

fn trainer(seed: u64) -> Trainer {
    let model = tiny_resnet(seed, 3, DType::F64);
    let config = OptimizerConfig::AdamW(AdamWConfig {
        lr: 0.01,
        weight_decay: 0.05,
        ..AdamWConfig::default()
    });
    let optimizer =
        ModelOptimizer::new(config, ParamGroups::default(), &Device::Cpu, DType::F64).unwrap();
    Trainer::new(
        model,
        Box::new(Classification),
        optimizer,
        Checkpointing::None,
    )
    .unwrap()
    .with_mode(Mode::EVAL)
}

/// This rank's rows of every batch, one step each.
fn train(t: &mut Trainer, batches: &[(Tensor, Tensor)], rank: usize, world: usize) {
    let per = GLOBAL_BATCH / world;
    for (x, y) in batches {
        let mine = |t: &Tensor| t.narrow(0, rank * per, per).unwrap();
        t.step(&mine(x), &mine(y), 0.01).unwrap();
    }
}

/// A ZeRO trainer of stage `stage` on `comm`, from the initialisation `seed`.
fn zero_trainer(seed: u64, stage: u8, comm: Arc<dyn Communicator>) -> (Trainer, ShardLayout) {
    let t = trainer(seed);
    let config = DdpConfig::default();
    let shards = ShardLayout::new(t.grads().layout().len(), comm.world_size());
    let strategy: Box<dyn Strategy> = match stage {
        1 => Box::new(zero_stage1(t.model(), t.grads(), comm, config).unwrap()),
        2 => Box::new(zero_stage2(t.model(), t.grads(), comm, config).unwrap()),
        _ => Box::new(zero_stage3(t.model(), t.grads(), comm, config).unwrap()),
    };
    (t.with_strategy(strategy).unwrap(), shards)
}

/// The parameters on every rank, whole.
fn whole(t: &mut Trainer) -> Vec<f64> {
    t.with_full_parameters(|model| Ok(flat_params(model.store())))
        .unwrap()
}

/// 2 ranks of ZeRO stage `stage` load the checkpoint in `dir` (through the full model and
/// state dict `full`, if given) and train on `later`.
fn two_ranks_after(
    (dir, full): (&Path, Option<(&Path, &Path)>),
    stage: u8,
    later: &[(Tensor, Tensor)],
) -> Vec<Vec<f64>> {
    on_thread_ranks(2, |rank, comm| {
        let (mut t, shards) = zero_trainer(7 + rank as u64, stage, comm.clone());
        match full {
            None => load_sharded(&mut t, comm.as_ref(), &shards, dir).unwrap(),
            Some(files) => import_full_state(&mut t, rank, &shards, files).unwrap(),
        }
        train(&mut t, later, rank, 2);
        whole(&mut t)
    })
}

/// Saves the shards of 4 ranks of ZeRO stage `saved_by` after 2 steps, and checks that every
/// way of loading them continues to the 4 ranks' parameters.
fn check_resumes(saved_by: u8) {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("step-2");
    let batches = image_batches(4, GLOBAL_BATCH);
    let (early, later) = batches.split_at(2);
    let reference = on_thread_ranks(4, |rank, comm| {
        let (mut t, shards) = zero_trainer(0, saved_by, comm.clone());
        train(&mut t, early, rank, 4);
        save_sharded(&mut t, comm.as_ref(), &shards, &dir).unwrap();
        train(&mut t, later, rank, 4);
        whole(&mut t)
    });
    assert!(dir.join("manifest.json").exists() && !scratch.path().join("step-2.partial").exists());
    let model = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu);
    let has_weights = model.unwrap().contains_key("fc.weight");
    assert_eq!(
        has_weights,
        saved_by < 3,
        "stage {saved_by}: the model file"
    );

    for stage in [2, 3] {
        for (rank, params) in two_ranks_after((&dir, None), stage, later)
            .iter()
            .enumerate()
        {
            let what = format!("saved by stage {saved_by}, 2 ranks of stage {stage}, rank {rank}");
            assert_close(params, &reference[0], 1e-10, &what);
        }
    }
    // One process: the trainer's own strategy, the whole buffer its shard.
    let mut single = trainer(9);
    let whole = ShardLayout::new(single.grads().layout().len(), 1);
    let one = weft_collectives::ShmCommunicator::new_thread_group(1).unwrap();
    load_sharded(&mut single, &one[0], &whole, &dir).unwrap();
    train(&mut single, later, 0, 1);
    assert_close(
        &flat_params(single.model().store()),
        &reference[0],
        1e-10,
        &format!("saved by stage {saved_by}, one process"),
    );

    let full = scratch.path().join("full-state.safetensors");
    let full_model = scratch.path().join("full-model.safetensors");
    export_full_state(&dir, &full).unwrap();
    export_full_model(&dir, &full_model).unwrap();
    let files = (full_model.as_path(), full.as_path());
    for (rank, params) in two_ranks_after((&dir, Some(files)), 3, later)
        .iter()
        .enumerate()
    {
        let what = format!("saved by stage {saved_by}, full state dict, rank {rank}");
        assert_close(params, &reference[0], 1e-10, &what);
    }
}

#[test]
fn shards_of_four_ranks_continue_on_two_ranks_one_process_and_through_a_full_state_dict() {
    check_resumes(1);
}

#[test]
fn zero3_shards_hold_the_parameters_and_continue_everywhere() {
    check_resumes(3);
}

#[test]
fn bad_checkpoints_are_errors_naming_the_file_and_what_differs() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("ckpt");
    let errors = on_thread_ranks(2, |_, comm| {
        let (mut t, shards) = zero_trainer(0, 1, comm.clone());
        save_sharded(&mut t, comm.as_ref(), &shards, &dir).unwrap();
        // The folder exists now: saving again is refused, not overwritten.
        save_sharded(&mut t, comm.as_ref(), &shards, &dir)
            .unwrap_err()
            .to_string()
    });
    assert!(errors[0].contains("exists"), "{}", errors[0]);
    let one = weft_collectives::ShmCommunicator::new_thread_group(1).unwrap();
    // Another model: a wider tiny ResNet has other shapes.
    let other = weft_models::resnet(
        &weft_models::ResNetConfig {
            widths: vec![4, 16],
            ..weft_testing::tiny_resnet_config(0, 3)
        },
        DType::F64,
        &Device::Cpu,
    )
    .unwrap();
    let optimizer = ModelOptimizer::new(
        OptimizerConfig::AdamW(AdamWConfig::default()),
        ParamGroups::default(),
        &Device::Cpu,
        DType::F64,
    )
    .unwrap();
    let mut wrong = Trainer::new(
        other,
        Box::new(Classification),
        optimizer,
        Checkpointing::None,
    )
    .unwrap();
    let shards = ShardLayout::new(wrong.grads().layout().len(), 1);
    let err = load_sharded(&mut wrong, &one[0], &shards, &dir)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("manifest.json") && err.contains("parameter"),
        "{err}"
    );
    let missing = load_sharded(&mut wrong, &one[0], &shards, &scratch.path().join("none"));
    assert!(missing.unwrap_err().to_string().contains("manifest.json"));
}
