//! Sharded checkpoints: a ZeRO run of 4 ranks saves its shards mid-training; the checkpoint is
//! loaded by 2 ranks (ZeRO-2), by one process, and through its full state dict (exported, then
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
use weft_parallel::zero::full_state::{export_full_state, import_full_state};
use weft_parallel::zero::{zero_stage1, zero_stage2, ShardLayout};
use weft_parallel::{DdpConfig, Trainer};
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
    let strategy = match stage {
        1 => zero_stage1(t.model(), t.grads(), comm, config).unwrap(),
        _ => zero_stage2(t.model(), t.grads(), comm, config).unwrap(),
    };
    let shards = strategy.shards().clone();
    (t.with_strategy(Box::new(strategy)).unwrap(), shards)
}

fn two_ranks_after(dir: &Path, later: &[(Tensor, Tensor)], full: Option<&Path>) -> Vec<Vec<f64>> {
    on_thread_ranks(2, |rank, comm| {
        let (mut t, shards) = zero_trainer(7 + rank as u64, 2, comm.clone());
        match full {
            None => load_sharded(&mut t, comm.as_ref(), &shards, dir).unwrap(),
            Some(state) => {
                let files = (dir.join("model.safetensors"), state.to_path_buf());
                import_full_state(&mut t, rank, &shards, (&files.0, &files.1)).unwrap()
            }
        }
        train(&mut t, later, rank, 2);
        flat_params(t.model().store())
    })
}

#[test]
fn shards_of_four_ranks_continue_on_two_ranks_one_process_and_through_a_full_state_dict() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("step-2");
    let batches = image_batches(4, GLOBAL_BATCH);
    let (early, later) = batches.split_at(2);
    let reference = on_thread_ranks(4, |rank, comm| {
        let (mut t, shards) = zero_trainer(0, 1, comm.clone());
        train(&mut t, early, rank, 4);
        save_sharded(&t, comm.as_ref(), &shards, &dir).unwrap();
        train(&mut t, later, rank, 4);
        flat_params(t.model().store())
    });
    assert!(dir.join("manifest.json").exists() && !scratch.path().join("step-2.partial").exists());

    for (rank, params) in two_ranks_after(&dir, later, None).iter().enumerate() {
        assert_close(
            params,
            &reference[0],
            1e-10,
            &format!("2 ranks, rank {rank}"),
        );
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
        "one process",
    );

    let full = scratch.path().join("full-state.safetensors");
    export_full_state(&dir, &full).unwrap();
    for (rank, params) in two_ranks_after(&dir, later, Some(&full)).iter().enumerate() {
        assert_close(
            params,
            &reference[0],
            1e-10,
            &format!("full state dict, rank {rank}"),
        );
    }
}

#[test]
fn bad_checkpoints_are_errors_naming_the_file_and_what_differs() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("ckpt");
    let errors = on_thread_ranks(2, |_, comm| {
        let (t, shards) = zero_trainer(0, 1, comm.clone());
        save_sharded(&t, comm.as_ref(), &shards, &dir).unwrap();
        // The folder exists now: saving again is refused, not overwritten.
        save_sharded(&t, comm.as_ref(), &shards, &dir)
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
