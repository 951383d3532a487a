//! The GPT split over 2 and 4 tensor-parallel thread ranks against the whole model with the
//! same seed, and `train-gpt --tp 2` against `--tp 1`.

use candle_core::{DType, Device, Tensor};
use weft_models::gpt::{gpt, gpt_with_layers, GptConfig};
use weft_models::loss::NextToken;
use weft_parallel::tensor::{TensorParallelGroup, VocabParallelNextToken};
use weft_tensor::{tape, Checkpointing, EntryKind, Mode, Objective, ParamStore};
use weft_testing::on_thread_ranks;
use weft_train::gpt_parallel::TensorParallelLayers;
use weft_train::tp_split::gather_full_state;
use weft_train::GptArgs;

fn config() -> GptConfig {
    let mut config = GptConfig::from_name("gpt-tiny").unwrap().with_seed(4);
    (config.vocab_size, config.vocab_multiple, config.n_embd) = (13, 8, 16);
    (config.n_head, config.n_layer, config.context) = (4, 2, 8);
    config
}

fn tokens(seed: u32) -> Tensor {
    let v: Vec<u32> = (0..16u32)
        .map(|i| (i * 5 + seed * 3 + i * i) % 13)
        .collect();
    Tensor::from_vec(v, (2, 8), &Device::Cpu).unwrap()
}

/// The whole model in f64, its logits and loss on `ids`/`targets`, and the loss's gradients.
struct Whole {
    model: weft_tensor::BlockModel,
    logits: Tensor,
    loss: Tensor,
    grads: candle_core::backprop::GradStore,
}

fn whole_model(config: &GptConfig, ids: &Tensor, targets: &Tensor) -> Whole {
    let model = gpt(config, DType::F64, &Device::Cpu).unwrap();
    let logits = model.forward(ids, Mode::TRAIN).unwrap();
    let loss = NextToken { vocab_size: 13 }
        .loss(&logits, targets)
        .unwrap()
        .loss;
    let grads = loss.backward().unwrap();
    Whole {
        model,
        logits,
        loss,
        grads,
    }
}

/// Logits (gathered by vocabulary block), the loss, and every parameter's gradient (gathered
/// into the whole model's layout) equal the whole model's at TP 2 and 4, in f64 within 1e-12:
/// the split model computes the same sums in a different order, nothing else.
#[test]
fn split_gpt_equals_the_whole_model_in_f64() {
    let config = config();
    let (ids, targets) = (tokens(0), tokens(1));
    let Whole {
        model: whole,
        logits,
        loss,
        grads,
    } = whole_model(&config, &ids, &targets);
    for tp in [2, 4] {
        on_thread_ranks(tp, |rank, comm| {
            let group = TensorParallelGroup::new(comm);
            let layers = TensorParallelLayers::new(group.clone());
            let model = gpt_with_layers(&config, DType::F64, &Device::Cpu, &layers).unwrap();
            let local = model.forward(&ids, Mode::TRAIN).unwrap();
            assert_eq!(local.dims(), [2, 8, 16 / tp]);
            let gathered = group.all_gather_last(&local).unwrap();
            assert!(
                max_diff(&gathered, &logits) < 1e-12,
                "tp {tp} rank {rank}: logits"
            );
            let objective = VocabParallelNextToken {
                vocab_size: 13,
                start: rank * 16 / tp,
                group: group.clone(),
            };
            let ours = objective.loss(&local, &targets).unwrap().loss;
            assert!(max_diff(&ours, &loss) < 1e-12, "tp {tp} rank {rank}: loss");
            let local_grads = ours.backward().unwrap();
            let mut grad_store = ParamStore::new(&Device::Cpu, DType::F64);
            for entry in model.store().entries() {
                let g = local_grads
                    .get(entry.tensor())
                    .expect("every parameter has a gradient");
                grad_store
                    .register(&entry.name, EntryKind::Parameter, g.clone())
                    .unwrap();
            }
            let full = gather_full_state(&grad_store, &layers.splits(), &group).unwrap();
            for (ours, entry) in full.entries().iter().zip(whole.store().entries()) {
                assert_eq!(ours.name, entry.name);
                let expected = grads.get(entry.tensor()).unwrap();
                let diff = max_diff(ours.tensor(), expected);
                assert!(diff < 1e-12, "tp {tp} rank {rank}: {} {diff}", entry.name);
            }
        });
    }
}

/// The split transformer layers differentiate themselves (their own backward, issuing the
/// tensor-parallel all-reduces: no Candle graph kept), and the tape's gradients, gathered, are
/// the whole model's in f64 within 1e-12, with and without recomputation; each rank keeps
/// less than the whole model's activations.
#[test]
fn split_layers_differentiate_themselves_as_the_whole_model() {
    let config = config();
    let (ids, targets) = (tokens(0), tokens(1));
    let Whole {
        model: whole,
        grads,
        ..
    } = whole_model(&config, &ids, &targets);
    let whole_tape = tape::forward(&whole, &ids, Mode::TRAIN, &Checkpointing::None).unwrap();
    let whole_bytes = whole_tape.saved_activation_bytes();
    on_thread_ranks(2, |rank, comm| {
        let group = TensorParallelGroup::new(comm);
        let layers = TensorParallelLayers::new(group.clone());
        let model = gpt_with_layers(&config, DType::F64, &Device::Cpu, &layers).unwrap();
        let layer = model.blocks()[1].explicit().expect("a transformer layer");
        let embedded = model.blocks()[0].forward(&ids, Mode::TRAIN).unwrap();
        let saving = layer.forward_saving(&embedded, Mode::TRAIN).unwrap();
        assert!(
            saving.is_some(),
            "rank {rank}: a split layer fell back to the graph"
        );
        for checkpointing in [Checkpointing::None, Checkpointing::All] {
            let objective = VocabParallelNextToken {
                vocab_size: 13,
                start: rank * 8,
                group: group.clone(),
            };
            let batch = (&ids, &targets);
            let (bytes, ours) = tape_gradients(&model, batch, &objective, &checkpointing);
            if checkpointing == Checkpointing::None {
                assert!(
                    bytes < whole_bytes,
                    "rank {rank}: {bytes} of {whole_bytes} bytes"
                );
            }
            let mut grad_store = ParamStore::new(&Device::Cpu, DType::F64);
            for (g, entry) in ours.into_iter().zip(model.store().entries()) {
                grad_store
                    .register(&entry.name, EntryKind::Parameter, g)
                    .unwrap();
            }
            let full = gather_full_state(&grad_store, &layers.splits(), &group).unwrap();
            for (ours, entry) in full.entries().iter().zip(whole.store().entries()) {
                let expected = grads.get(entry.tensor()).unwrap();
                let diff = max_diff(ours.tensor(), expected);
                assert!(
                    diff < 1e-12,
                    "rank {rank} {checkpointing:?}: {} {diff}",
                    entry.name
                );
            }
        }
    });
}

/// The split model's gathered state is the whole model's initialisation (every rank keeps
/// only its slices of the seeded values).
#[test]
fn split_initialisation_gathers_to_the_whole_one() {
    let config = config();
    let whole = gpt(&config, DType::F32, &Device::Cpu).unwrap();
    on_thread_ranks(2, |_, comm| {
        let group = TensorParallelGroup::new(comm);
        let layers = TensorParallelLayers::new(group.clone());
        let model = gpt_with_layers(&config, DType::F32, &Device::Cpu, &layers).unwrap();
        assert!(model.store().num_parameters() < whole.store().num_parameters() * 3 / 5);
        let full = gather_full_state(model.store(), &layers.splits(), &group).unwrap();
        for (ours, entry) in full.entries().iter().zip(whole.store().entries()) {
            assert_eq!(
                max_diff(ours.tensor(), entry.tensor()),
                0.0,
                "{}",
                entry.name
            );
        }
    });
}

mod support;
use support::{max_diff, tape_gradients};

/// Runs `train-gpt` with `args` as a job of two thread ranks.
fn run_on_two_thread_ranks(args: &GptArgs) {
    support::run(args, 2)
}

/// `(loss, grad_norm)` of each step line of a run's metrics.
fn steps(dir: &std::path::Path) -> Vec<(f64, Option<f64>)> {
    let lines = support::lines(dir);
    let steps = lines.into_iter().filter(|l| l.get("step").is_some());
    steps
        .map(|l| (l["loss"].as_f64().unwrap(), l["grad_norm"].as_f64()))
        .collect()
}

/// `train-gpt --tp 2` (two thread ranks, one tensor-parallel group) logs the losses of
/// `--tp 1` over five AdamW steps within 1e-4, also with dropout (the masks over the split
/// attention heads are the whole model's, those over replicated activations the same on both
/// ranks) (f32: the split sums round differently, about
/// 1e-7 relative per step, and AdamW's normalised update passes that on), also with gradient
/// clipping active (the global norm counts the whole parameters once: equal within 1e-4
/// relative); its checkpoint gathers into the whole model's layout and initialises a split run
/// (`--init-from` cut into slices) to the first loss of a whole one (1e-5).
#[test]
fn train_gpt_tp2_logs_the_losses_of_tp1() {
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().to_str().unwrap();
    let flags = |name: &str, extra: &[&str]| -> GptArgs {
        let base = ["--out", out_dir, "--name", name];
        support::tiny(&[&base[..], extra].concat())
    };
    for (case, extra) in [
        ("plain", &[][..]),
        ("clipped", &["--clip-grad-norm", "0.3"][..]),
        ("dropout", &["--dropout", "0.1"][..]),
    ] {
        let one = format!("{case}-tp1");
        let two = format!("{case}-tp2");
        weft_train::gpt::run(&flags(&one, extra)).unwrap();
        let split_flags: Vec<&str> = extra
            .iter()
            .copied()
            .chain(["--tp", "2", "--nproc", "2"])
            .collect();
        run_on_two_thread_ranks(&flags(&two, &split_flags));
        let (a, b) = (steps(&out.path().join(&one)), steps(&out.path().join(&two)));
        assert_eq!(a.len(), 5);
        assert_eq!(a.len(), b.len());
        for (step, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                (x.0 - y.0).abs() < 1e-4,
                "{case} step {step}: {} vs {}",
                x.0,
                y.0
            );
            match (x.1, y.1) {
                (None, None) => assert_ne!(case, "clipped"),
                (Some(p), Some(q)) => {
                    assert!(p > 0.3, "{case} step {step}: the clipping must act ({p})");
                    assert!(
                        (p - q).abs() < 1e-4 * p,
                        "{case} step {step}: norm {p} vs {q}"
                    );
                }
                other => panic!("{case} step {step}: grad_norm {other:?}"),
            }
        }
    }
    // Dropout acted (the split run dropped what the whole run dropped: the same losses above).
    let (plain, dropped) = (
        steps(&out.path().join("plain-tp1")),
        steps(&out.path().join("dropout-tp1")),
    );
    assert!(
        (plain[1].0 - dropped[1].0).abs() > 1e-3,
        "dropout changed nothing"
    );
    // The checkpoint (gathered from the split model) initialises a whole and a split run alike.
    let init = out.path().join("plain-tp2/model.safetensors");
    let init = init.to_str().unwrap();
    let from = |name: &str, extra: &[&str]| {
        let mut more = vec!["--init-from", init, "--steps", "2"];
        more.extend_from_slice(extra);
        flags(name, &more)
    };
    weft_train::gpt::run(&from("from-tp1", &[])).unwrap();
    run_on_two_thread_ranks(&from("from-tp2", &["--tp", "2", "--nproc", "2"]));
    let (a, b) = (
        steps(&out.path().join("from-tp1")),
        steps(&out.path().join("from-tp2")),
    );
    let fresh = steps(&out.path().join("plain-tp1"));
    assert!((a[0].0 - b[0].0).abs() < 1e-5, "{} vs {}", a[0].0, b[0].0);
    assert!(
        a[0].0 < fresh[0].0 - 0.05,
        "trained weights: {} vs fresh {}",
        a[0].0,
        fresh[0].0
    );
    let saved = candle_core::safetensors::load(
        out.path().join("plain-tp2/model.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    assert_eq!(
        saved["transformer.h.0.attn.c_attn.weight"].dims(),
        [64, 192]
    );
    assert_eq!(saved["transformer.wte.weight"].dims(), [256, 64]);
}
