//! Tensor-parallel checkpoints: a split GPT (TP 2, and TP 2 × 2 ZeRO-1 replicas) saves after two
//! steps; a fresh split model of another seed loads it and continues to the parameters of an
//! unbroken four-step run (f64: equal within 1e-12); the checkpoint's full export is the model
//! gathered at the save.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use weft_collectives::Communicator;
use weft_models::gpt::{gpt_with_layers, GptConfig};
use weft_optim::{AdamWConfig, ModelOptimizer, OptimizerConfig, ParamGroups};
use weft_parallel::tensor::VocabParallelNextToken;
use weft_parallel::zero::ShardLayout;
use weft_parallel::Trainer;
use weft_tensor::Checkpointing;
use weft_testing::on_thread_ranks;
use weft_train::gpt_checkpoint::{export_full_model, load_tensor_parallel, save_tensor_parallel};
use weft_train::gpt_parallel::{GptMesh, TensorParallelLayers};
use weft_train::parallelize::{self, GptParallelism};
use weft_train::tp_split::gather_full_state;

fn config(seed: u64) -> GptConfig {
    let mut config = GptConfig::from_name("gpt-tiny").unwrap().with_seed(seed);
    (config.vocab_size, config.vocab_multiple, config.n_embd) = (13, 8, 16);
    (config.n_head, config.n_layer, config.context) = (4, 2, 8);
    config
}

/// Four global batches of 4 sequences of 8 tokens.
fn batches() -> Vec<(Tensor, Tensor)> {
    (0..4u32)
        .map(|s| {
            let tokens = |shift: u32| {
                let v: Vec<u32> = (0..32u32)
                    .map(|i| (i * 5 + s * 7 + shift + i * i) % 13)
                    .collect();
                Tensor::from_vec(v, (4, 8), &Device::Cpu).unwrap()
            };
            (tokens(0), tokens(1))
        })
        .collect()
}

/// A split trainer on `world`'s ranks, `tp` per group, ZeRO stage `zero` over the replicas.
fn trainer(
    seed: u64,
    world: &Arc<dyn Communicator>,
    tp: usize,
    zero: u8,
) -> (Trainer, GptMesh, TensorParallelLayers) {
    let mesh = GptMesh::new(Some(world), tp).unwrap();
    let group = mesh.tp.clone().unwrap();
    let layers = TensorParallelLayers::new(group.clone());
    let model = gpt_with_layers(&config(seed), DType::F64, &Device::Cpu, &layers).unwrap();
    let optimizer = ModelOptimizer::new(
        OptimizerConfig::AdamW(AdamWConfig {
            lr: 0.01,
            weight_decay: 0.1,
            ..AdamWConfig::default()
        }),
        ParamGroups::default(),
        &Device::Cpu,
        DType::F64,
    )
    .unwrap();
    let objective = VocabParallelNextToken {
        vocab_size: 13,
        start: group.rank() * 16 / group.size(),
        group: group.clone(),
    };
    let t = Trainer::new(model, Box::new(objective), optimizer, Checkpointing::None).unwrap();
    let plan = GptParallelism {
        zero,
        tensor: Some((group, layers.splits())),
        ..GptParallelism::default()
    };
    let t = parallelize::gpt(t, mesh.data_parallel(), &plan).unwrap();
    (t, mesh, layers)
}

fn train(t: &mut Trainer, mesh: &GptMesh, batches: &[(Tensor, Tensor)]) {
    let rows = 4 / mesh.dp_size;
    for (x, y) in batches {
        let mine = |t: &Tensor| t.narrow(0, mesh.dp_rank * rows, rows).unwrap();
        t.step(&mine(x), &mine(y), 0.01).unwrap();
    }
}

fn full_state(
    t: &Trainer,
    mesh: &GptMesh,
    layers: &TensorParallelLayers,
) -> Vec<(String, Vec<f64>)> {
    let full = gather_full_state(
        t.model().store(),
        &layers.splits(),
        mesh.tp.as_ref().unwrap(),
    )
    .unwrap();
    full.entries()
        .iter()
        .map(|e| {
            (
                e.name.clone(),
                e.tensor().flatten_all().unwrap().to_vec1().unwrap(),
            )
        })
        .collect()
}

fn check_case(world: usize, tp: usize, zero: u8, dir: &Path) {
    let data = batches();
    let shards = |t: &Trainer, mesh: &GptMesh| {
        (zero > 0).then(|| ShardLayout::new(t.grads().layout().len(), mesh.dp_size))
    };
    let straight = on_thread_ranks(world, |_, comm| {
        let (mut t, mesh, layers) = trainer(1, &comm, tp, zero);
        train(&mut t, &mesh, &data);
        full_state(&t, &mesh, &layers)
    });
    let saved = on_thread_ranks(world, |_, comm| {
        let (mut t, mesh, layers) = trainer(1, &comm, tp, zero);
        train(&mut t, &mesh, &data[..2]);
        let zero_shards = shards(&t, &mesh);
        save_tensor_parallel(&mut t, &mesh, &layers.splits(), zero_shards.as_ref(), dir).unwrap();
        full_state(&t, &mesh, &layers)
    });
    let resumed = on_thread_ranks(world, |_, comm| {
        let (mut t, mesh, layers) = trainer(2, &comm, tp, zero);
        let own = shards(&t, &mesh);
        load_tensor_parallel(&mut t, &mesh, own.as_ref(), dir).unwrap();
        train(&mut t, &mesh, &data[2..]);
        full_state(&t, &mesh, &layers)
    });
    for ((name, a), (_, b)) in straight[0].iter().zip(&resumed[0]) {
        let diff = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(diff < 1e-12, "world {world}: {name} differs by {diff}");
    }
    let exported = export_full_model(dir).unwrap();
    for (name, values) in &saved[0] {
        let got: Vec<f64> = exported[name].flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(&got, values, "world {world}: exported {name}");
    }
}

#[test]
fn split_checkpoints_resume_exactly_and_export_the_whole_model() {
    let scratch = tempfile::tempdir().unwrap();
    check_case(2, 2, 0, &scratch.path().join("tp2"));
    check_case(4, 2, 1, &scratch.path().join("tp2-zero1"));
    // A second save into the same folder is refused; a group of another size cannot load it.
    let dir = scratch.path().join("tp2");
    on_thread_ranks(2, |_, comm| {
        let (mut t, mesh, layers) = trainer(1, &comm, 2, 0);
        let err = save_tensor_parallel(&mut t, &mesh, &layers.splits(), None, &dir).unwrap_err();
        assert!(err.to_string().contains("exists already"), "{err}");
    });
    on_thread_ranks(4, |_, comm| {
        let (mut t, mesh, _) = trainer(1, &comm, 4, 0);
        let err = load_tensor_parallel(&mut t, &mesh, None, &dir)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("groups of 2 ranks") && err.contains("groups of 4"),
            "{err}"
        );
    });
    // A damaged manifest is a one-line error naming the file and the field, never a panic.
    let manifest = dir.join("tensor-parallel.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let columns = json["splits"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find_map(|entry| entry[1].get_mut("columns"))
        .expect("a column-split entry");
    columns["groups"] = 0.into();
    std::fs::write(&manifest, json.to_string()).unwrap();
    let err = format!("{:#}", export_full_model(&dir).unwrap_err());
    assert!(
        err.contains("tensor-parallel.json: field splits (") && err.contains("0 column groups"),
        "{err}"
    );
}
