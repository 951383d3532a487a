//! The block-wise tape's seams for parallel strategies, against one whole-graph `backward()`
//! in f64: tied weights (a parameter used by two blocks) reported once with the sum of both
//! contributions at the earliest block using it; backward from a given output gradient (a
//! pipeline stage) and the gradient of the model's input; hooks before every block's forward
//! and backward, in order.

use std::ops::Range;

use candle_core::{DType, Device, Tensor, Var};
use weft_tensor::tape::{self, BackwardHooks, Seed, TapeOptions};
use weft_tensor::{Block, BlockGrads, BlockModel, EntryId, Mode, ParamStore, Result, TensorError};

/// `tanh(x W^T)` with its own weight, or with another block's (`shared`), transposed.
struct Dense {
    name: String,
    weight: Var,
    entries: Range<EntryId>,
    shared: Vec<EntryId>,
    transposed: bool,
}

impl Block for Dense {
    fn name(&self) -> &str {
        &self.name
    }

    fn forward(&self, x: &Tensor, _mode: Mode) -> Result<Tensor> {
        let w = if self.transposed {
            self.weight.as_tensor().clone()
        } else {
            self.weight.t()?
        };
        Ok(x.matmul(&w)?.tanh()?)
    }

    fn entries(&self) -> Range<EntryId> {
        self.entries.clone()
    }

    fn shared_parameters(&self) -> Vec<EntryId> {
        self.shared.clone()
    }
}

/// Block 0: `tanh(x E^T)` (E is 5x4); block 1: its own 5x5 weight; block 2: `tanh(h E)`,
/// reusing block 0's E (an embedding tied to a head).
fn tied_model() -> BlockModel {
    let dev = Device::Cpu;
    let mut store = ParamStore::new(&dev, DType::F64);
    let mut make = |name: &str, rows, cols| {
        let mut scope = store.scope(name);
        let start = scope.store_len();
        let w = Tensor::randn(0f64, 0.5, (rows, cols), &dev).unwrap();
        let weight = scope.parameter("weight", w).unwrap();
        (weight, start..scope.store_len())
    };
    let (embedding, e_entries) = make("embed", 5, 4);
    let (middle, m_entries) = make("middle", 5, 5);
    let blocks: Vec<Box<dyn Block>> = vec![
        Box::new(Dense {
            name: "embed".into(),
            weight: embedding.clone(),
            entries: e_entries.clone(),
            shared: vec![],
            transposed: false,
        }),
        Box::new(Dense {
            name: "middle".into(),
            weight: middle,
            entries: m_entries,
            shared: vec![],
            transposed: false,
        }),
        Box::new(Dense {
            name: "head".into(),
            weight: embedding,
            entries: 2..2,
            shared: vec![e_entries.start],
            transposed: true,
        }),
    ];
    BlockModel::new(store, blocks).unwrap()
}

fn flat(t: &Tensor) -> Vec<f64> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

fn assert_close(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        // The same operations in a different order of summation: f64 rounding only.
        assert!(
            (x - y).abs() <= 1e-12 * (1.0 + y.abs()),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

/// Records every hook call and the reported gradients.
#[derive(Default)]
struct Recorder {
    events: Vec<String>,
    grads: Vec<(EntryId, Option<Tensor>)>,
}

impl BackwardHooks<TensorError> for Recorder {
    fn before_block(&mut self, block: usize) -> Result<()> {
        self.events.push(format!("B{block}"));
        Ok(())
    }

    fn block_ready(&mut self, ready: BlockGrads) -> Result<()> {
        let ids: Vec<String> = ready.grads.iter().map(|(id, _)| id.to_string()).collect();
        self.events
            .push(format!("ready{}[{}]", ready.block, ids.join(",")));
        self.grads.extend(ready.grads);
        Ok(())
    }
}

#[test]
fn tied_weight_is_reported_once_with_both_contributions_summed() {
    let model = tied_model();
    let x = Tensor::randn(0f64, 1.0, (3, 4), &Device::Cpu).unwrap();
    let loss = |out: &Tensor| out.sqr().unwrap().sum_all().unwrap();
    let reference = loss(&model.forward(&x, Mode::EVAL).unwrap())
        .backward()
        .unwrap();

    let mut forwards = Vec::new();
    let tape = tape::forward_with(&model, &x, &TapeOptions::default(), |i| {
        forwards.push(i);
        Ok::<(), TensorError>(())
    })
    .unwrap();
    assert_eq!(forwards, [0, 1, 2]);
    let mut hooks = Recorder::default();
    let total = loss(tape.output());
    let input_grad = tape
        .backward_with(Seed::Loss(&total), &model, &mut hooks)
        .unwrap();
    assert!(input_grad.is_none(), "not asked for");
    // The head (block 2) uses the embedding but reports nothing: block 0 is its earliest user.
    assert_eq!(
        hooks.events,
        ["B2", "ready2[]", "B1", "ready1[1]", "B0", "ready0[0]"]
    );
    for (id, grad) in &hooks.grads {
        let param = model.store().entries()[*id].tensor();
        let name = &model.store().entries()[*id].name;
        assert_close(
            &flat(grad.as_ref().unwrap()),
            &flat(reference.get(param).unwrap()),
            name,
        );
    }
}

#[test]
fn backward_from_an_output_gradient_returns_the_input_gradient() {
    let model = tied_model();
    let x = Var::from_tensor(&Tensor::randn(0f64, 1.0, (3, 4), &Device::Cpu).unwrap()).unwrap();
    let dy = Tensor::randn(0f64, 1.0, (3, 4), &Device::Cpu).unwrap();
    // Reference: the whole graph from a leaf input, seeded with sum(y * dy).
    let y = model.forward(x.as_tensor(), Mode::EVAL).unwrap();
    let reference = y.mul(&dy).unwrap().sum_all().unwrap().backward().unwrap();

    let options = TapeOptions {
        input_grad: true,
        ..TapeOptions::default()
    };
    let tape = tape::forward_with(&model, x.as_tensor(), &options, |_| {
        Ok::<(), TensorError>(())
    })
    .unwrap();
    let mut hooks = Recorder::default();
    let dx = tape
        .backward_with(Seed::OutputGrad(&dy), &model, &mut hooks)
        .unwrap()
        .expect("asked for the input gradient");
    assert_close(
        &flat(&dx),
        &flat(reference.get(x.as_tensor()).unwrap()),
        "dx",
    );
    let embed = model.store().entries()[0].tensor();
    let (_, g) = hooks.grads.iter().find(|(id, _)| *id == 0).unwrap();
    assert_close(
        &flat(g.as_ref().unwrap()),
        &flat(reference.get(embed).unwrap()),
        "embed.weight",
    );
}

#[test]
fn output_gradient_of_the_wrong_shape_is_an_error() {
    let model = tied_model();
    let x = Tensor::randn(0f64, 1.0, (3, 4), &Device::Cpu).unwrap();
    let tape = tape::forward(&model, &x, Mode::EVAL, &Default::default()).unwrap();
    let wrong = Tensor::zeros((2, 4), DType::F64, &Device::Cpu).unwrap();
    let err = tape
        .backward_with(Seed::OutputGrad(&wrong), &model, &mut Recorder::default())
        .unwrap_err();
    assert!(err.to_string().contains("[2, 4]"), "{err}");
}

#[test]
fn sharing_a_non_parameter_or_own_entry_is_refused_naming_the_block() {
    let dev = Device::Cpu;
    let mut store = ParamStore::new(&dev, DType::F64);
    let weight = store
        .scope("a")
        .parameter("weight", Tensor::ones((2, 2), DType::F64, &dev).unwrap())
        .unwrap();
    let block = Dense {
        name: "a".into(),
        weight,
        entries: 0..1,
        shared: vec![0],
        transposed: false,
    };
    let err = BlockModel::new(store, vec![Box::new(block)])
        .err()
        .expect("sharing its own parameter");
    assert!(err.to_string().contains("block `a`"), "{err}");
}

#[test]
fn inference_path_matches_the_graph_and_keeps_no_graph() {
    let model = tied_model();
    let x = Tensor::randn(0f64, 1.0, (3, 4), &Device::Cpu).unwrap();
    let y = tape::infer(&model, &x, Mode::EVAL).unwrap();
    assert_close(
        &flat(&y),
        &flat(&model.forward(&x, Mode::EVAL).unwrap()),
        "y",
    );
    assert!(!y.track_op(), "the inference output carries no graph");
}
