//! The Llama family split over two tensor-parallel thread ranks (Megatron's plan: attention
//! by heads with grouped-query attention, the SwiGLU MLP by features, the table and head by
//! vocabulary rows) against the whole model with the same seed, in f64; and `train-gpt
//! --model llama-tiny --tp 2` against one process, alone and with data parallelism, pipeline
//! stages, `--init-from`, resume and export.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use weft_models::llama::{llama, llama_split, Architecture, LlamaConfig};
use weft_models::loss::NextToken;
use weft_parallel::tensor::{TensorParallelGroup, VocabParallelNextToken};
use weft_tensor::{tape, Checkpointing, EntryKind, Mode, Objective, ParamStore};
use weft_testing::on_thread_ranks;
use weft_train::gpt_parallel::TensorParallelLayers;
use weft_train::tp_split::gather_full_state;

mod support;
use support::{llama_tiny as flags, losses_and_export, max_diff, run, tape_gradients, values};

/// `llama-tiny` (separate projections, tied head), and a Phi-3 of the same shape (fused
/// q | k | v in unequal groups, 4 query heads over 2 key/value heads; fused gate | up; untied).
fn configs() -> [LlamaConfig; 2] {
    let llama = LlamaConfig::from_name("llama-tiny").unwrap().with_seed(9);
    let phi3 = LlamaConfig {
        architecture: Architecture::Phi3,
        tie_word_embeddings: false,
        ..llama.clone()
    };
    [llama, phi3]
}

fn tokens(seed: u32) -> Tensor {
    let v: Vec<u32> = (0..16u32)
        .map(|i| (i * 37 + seed * 101 + i * i * 7) % 256)
        .collect();
    Tensor::from_vec(v, (2, 8), &Device::Cpu).unwrap()
}

/// Per-parameter gradients `(entry, gradient)` as a store with the model's names, gathered
/// from the ranks' parts into the whole model's layout.
fn gathered(
    model: &weft_tensor::BlockModel,
    grads: Vec<Tensor>,
    layers: &TensorParallelLayers,
    group: &TensorParallelGroup,
) -> ParamStore {
    let mut store = ParamStore::new(&Device::Cpu, DType::F64);
    for (entry, grad) in model.store().entries().iter().zip(grads) {
        store
            .register(&entry.name, EntryKind::Parameter, grad)
            .unwrap();
    }
    gather_full_state(&store, &layers.splits(), group).unwrap()
}

/// The split model's initial values gather to the whole model's exactly; its logits (gathered
/// by vocabulary block), the vocabulary-parallel loss and every gradient (through Candle's
/// graph, and through the blocks' own backward with and without recomputation, which issue
/// the all-reduces themselves) equal the whole model's in f64 within 1e-12: the same sums in
/// another order. Each rank keeps fewer activations than the whole model.
#[test]
fn split_llama_equals_the_whole_model_in_f64() {
    let (ids, targets) = (tokens(0), tokens(1));
    for config in configs() {
        let name = format!("{:?}", config.architecture);
        let whole = llama(&config, DType::F64, &Device::Cpu).unwrap();
        let logits = whole.forward(&ids, Mode::TRAIN).unwrap();
        let loss = NextToken { vocab_size: 256 }
            .loss(&logits, &targets)
            .unwrap();
        let grads = loss.loss.backward().unwrap();
        let expected: Vec<&Tensor> = whole
            .store()
            .entries()
            .iter()
            .map(|e| grads.get(e.tensor()).unwrap())
            .collect();
        let whole_tape = tape::forward(&whole, &ids, Mode::TRAIN, &Checkpointing::None).unwrap();
        let whole_bytes = whole_tape.saved_activation_bytes();
        on_thread_ranks(2, |rank, comm| {
            let group = TensorParallelGroup::new(comm);
            let layers = Arc::new(TensorParallelLayers::new(group.clone()));
            let model = llama_split(&config, DType::F64, &Device::Cpu, layers.clone()).unwrap();
            let init = gather_full_state(model.store(), &layers.splits(), &group).unwrap();
            for (ours, entry) in init.entries().iter().zip(whole.store().entries()) {
                assert_eq!(ours.name, entry.name);
                let diff = max_diff(ours.tensor(), entry.tensor());
                assert_eq!(diff, 0.0, "{name} rank {rank}: initial {}", entry.name);
            }
            let objective = VocabParallelNextToken {
                vocab_size: 256,
                start: rank * 128,
                group: group.clone(),
            };
            let check = |grads: Vec<Tensor>, how: &str| {
                let full = gathered(&model, grads, &layers, &group);
                for (ours, (entry, expected)) in full
                    .entries()
                    .iter()
                    .zip(whole.store().entries().iter().zip(&expected))
                {
                    let diff = max_diff(ours.tensor(), expected);
                    assert!(diff < 1e-12, "{name} {how}: {} {diff}", entry.name);
                }
            };

            let local = model.forward(&ids, Mode::TRAIN).unwrap();
            assert_eq!(local.dims(), [2, 8, 128]);
            let all = group.all_gather_last(&local).unwrap();
            assert!(
                max_diff(&all, &logits) < 1e-12,
                "{name} rank {rank}: logits"
            );
            let ours = objective.loss(&local, &targets).unwrap().loss;
            assert!(max_diff(&ours, &loss.loss) < 1e-12, "{name}: loss");
            let graph = ours.backward().unwrap();
            let entries = model.store().entries();
            check(
                entries
                    .iter()
                    .map(|e| graph.get(e.tensor()).unwrap().clone())
                    .collect(),
                "graph",
            );

            for (i, block) in model.blocks().iter().enumerate().take(3) {
                let input = match i {
                    0 => ids.clone(),
                    _ => whole.blocks()[0].forward(&ids, Mode::TRAIN).unwrap(),
                };
                let explicit = block
                    .explicit()
                    .expect("every Llama block has its own backward");
                let saving = explicit.forward_saving(&input, Mode::TRAIN).unwrap();
                assert!(
                    saving.is_some(),
                    "{name}: split block {i} fell back to the graph"
                );
            }
            for checkpointing in [Checkpointing::None, Checkpointing::All] {
                let batch = (&ids, &targets);
                let (bytes, grads) = tape_gradients(&model, batch, &objective, &checkpointing);
                if checkpointing == Checkpointing::None {
                    assert!(
                        bytes < whole_bytes,
                        "{name}: {bytes} of {whole_bytes} bytes"
                    );
                }
                check(grads, &format!("{checkpointing:?}"));
            }
        });
    }
}

/// `--tp 2` logs the one-process losses and exports its weights (gathered into the whole
/// model's names and shapes) within 1e-4 (f32: the split sums round differently, about 1e-7
/// relative a step, and AdamW's normalised update passes that on), alone, with two ZeRO-1 and
/// two ZeRO-3 replicas (`--nproc 4`), and with two pipeline stages over two micro-batches.
#[test]
fn train_gpt_tp2_follows_one_process() {
    let out = tempfile::tempdir().unwrap();
    let micro = ["--micro-batches", "2"];
    let cases: [(&str, &[&str], usize, &[&str]); 4] = [
        ("tp2", &[], 2, &["--nproc", "2", "--tp", "2"]),
        (
            "tp2-dp2",
            &[],
            4,
            &["--nproc", "4", "--tp", "2", "--zero", "1"],
        ),
        (
            "tp2-dp2-zero3",
            &[],
            4,
            &["--nproc", "4", "--tp", "2", "--zero", "3"],
        ),
        (
            "tp2-pp2",
            &micro,
            4,
            &["--nproc", "4", "--tp", "2", "--pp", "2"],
        ),
    ];
    for (name, shared, ranks, layout) in cases {
        let one = format!("{name}-one");
        run(&flags(out.path(), &[shared, &["--name", &one]].concat()), 1);
        run(
            &flags(out.path(), &[shared, layout, &["--name", name]].concat()),
            ranks,
        );
        let (expected, weights) = losses_and_export(out.path(), &one);
        let (got, split_weights) = losses_and_export(out.path(), name);
        assert_eq!(got.len(), 5, "{name}");
        for (step, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert!(((g - e) / e).abs() < 1e-4, "{name} step {step}: {g} vs {e}");
        }
        assert_eq!(weights.len(), split_weights.len(), "{name}");
        for (key, value) in &weights {
            let other = &split_weights[key];
            assert_eq!(value.dims(), other.dims(), "{name}: {key}");
            assert!(max_diff(value, other) < 1e-4, "{name}: {key}");
        }
    }
}

/// A split run starts from the weights `--init-from` gives (each rank cutting its parts from
/// the whole tensors): its first loss is the one-process run's from the same folder (1e-5);
/// and resumed from its tensor-parallel checkpoint it logs the uninterrupted losses bit for
/// bit.
#[test]
fn split_runs_load_hf_weights_and_resume() {
    let out = tempfile::tempdir().unwrap();
    run(&flags(out.path(), &["--name", "first"]), 1);
    let hf = out.path().join("first/hf");
    let from = |name: &str, layout: &[&str]| {
        let mut args = flags(
            out.path(),
            &[layout, &["--name", name, "--steps", "2"]].concat(),
        );
        args.model.model = None;
        args.model.init_from = Some(hf.clone());
        args
    };
    run(&from("from-one", &[]), 1);
    run(&from("from-tp2", &["--nproc", "2", "--tp", "2"]), 2);
    let (a, b) = (
        values(&out.path().join("from-one"), "loss"),
        values(&out.path().join("from-tp2"), "loss"),
    );
    let fresh = values(&out.path().join("first"), "loss");
    assert!(((a[0] - b[0]) / a[0]).abs() < 1e-5, "{a:?} vs {b:?}");
    assert!(
        a[0] < fresh[0] - 0.05,
        "trained {} vs fresh {}",
        a[0],
        fresh[0]
    );

    let layout = ["--nproc", "2", "--tp", "2"];
    let with = |more: &[&str]| flags(out.path(), &[&layout[..], more].concat());
    run(&with(&["--name", "straight"]), 2);
    run(&with(&["--name", "saved", "--save-every", "2"]), 2);
    let checkpoint = out.path().join("saved/checkpoints/step-00000002");
    run(
        &with(&["--name", "saved", "--resume", checkpoint.to_str().unwrap()]),
        2,
    );
    let expected = values(&out.path().join("straight"), "loss");
    assert_eq!(values(&out.path().join("saved"), "loss"), expected);
}
