//! Block-wise backward and checkpointing against one whole-graph `backward()`.

use std::ops::Range;

use candle_core::{DType, Device, Tensor, Var};
use weft_tensor::{
    tape, Block, BlockGrads, BlockModel, Checkpointing, EntryId, Mode, ParamStore, Result,
};

/// `tanh(x W^T + b)` with a running-mean buffer updated like BatchNorm's.
struct Dense {
    name: String,
    weight: Var,
    bias: Var,
    running_mean: Var,
    entries: Range<EntryId>,
}

impl Block for Dense {
    fn name(&self) -> &str {
        &self.name
    }

    fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        if mode.update_running_stats {
            let updated = (self.running_mean.as_tensor() * 0.9)?.add(&(x.mean_all()? * 0.1)?)?;
            self.running_mean.set(&updated.detach())?;
        }
        let y = x.matmul(&self.weight.t()?)?.broadcast_add(&self.bias)?;
        Ok(y.tanh()?)
    }

    fn entries(&self) -> Range<EntryId> {
        self.entries.clone()
    }
}

fn model(dtype: DType, widths: &[usize]) -> BlockModel {
    let dev = Device::Cpu;
    let mut store = ParamStore::new(&dev, dtype);
    let mut blocks: Vec<Box<dyn Block>> = Vec::new();
    for (i, pair) in widths.windows(2).enumerate() {
        let name = format!("block{i}");
        let mut scope = store.scope(&name);
        let start = scope.store_len();
        let w = Tensor::randn(0f32, 0.5, (pair[1], pair[0]), &dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let b = Tensor::randn(0f32, 0.1, pair[1], &dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let weight = scope.parameter("weight", w).unwrap();
        let bias = scope.parameter("bias", b).unwrap();
        let running_mean = scope
            .buffer("running_mean", Tensor::zeros((), dtype, &dev).unwrap())
            .unwrap();
        let entries = start..scope.store_len();
        blocks.push(Box::new(Dense {
            name,
            weight,
            bias,
            running_mean,
            entries,
        }));
    }
    BlockModel::new(store, blocks).unwrap()
}

fn loss_of(output: &Tensor) -> Tensor {
    output.sqr().unwrap().mean_all().unwrap()
}

/// Gradients from one whole-graph backward, by entry id.
fn reference_grads(model: &BlockModel, x: &Tensor) -> Vec<(EntryId, Vec<f64>)> {
    let grads = loss_of(&model.forward(x, Mode::EVAL).unwrap())
        .backward()
        .unwrap();
    model
        .store()
        .parameter_ids()
        .into_iter()
        .map(|id| {
            (
                id,
                flat(grads.get(model.store().entries()[id].tensor()).unwrap()),
            )
        })
        .collect()
}

fn flat(t: &Tensor) -> Vec<f64> {
    t.flatten_all()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// Gradients from the block-wise backward, with the order in which blocks were reported.
fn blockwise_grads(
    model: &BlockModel,
    x: &Tensor,
    mode: Mode,
    ckpt: &Checkpointing,
) -> (Vec<(EntryId, Vec<f64>)>, Vec<usize>) {
    let tape = tape::forward(model, x, mode, ckpt).unwrap();
    let loss = loss_of(tape.output());
    let mut grads = Vec::new();
    let mut order = Vec::new();
    tape.backward(
        &loss,
        model,
        |ready: BlockGrads| -> weft_tensor::Result<()> {
            order.push(ready.block);
            for (id, g) in ready.grads {
                grads.push((id, flat(&g.expect("every parameter is used"))));
            }
            Ok(())
        },
    )
    .unwrap();
    grads.sort_by_key(|(id, _)| *id);
    (grads, order)
}

fn assert_close(a: &[(EntryId, Vec<f64>)], b: &[(EntryId, Vec<f64>)], tol: f64) {
    assert_eq!(a.len(), b.len());
    for ((ia, ga), (ib, gb)) in a.iter().zip(b) {
        assert_eq!(ia, ib);
        for (x, y) in ga.iter().zip(gb) {
            assert!(
                (x - y).abs() <= tol * (1.0 + y.abs()),
                "entry {ia}: {x} vs {y}"
            );
        }
    }
}

#[test]
fn blockwise_equals_whole_graph_in_f64_and_f32() {
    // f64: the two computations run the same operations in the same order up to the extra
    // `sum(y * g)` product, so they agree to rounding (1e-12); f32 to 1e-5.
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
        let m = model(dtype, &[6, 5, 4, 3]);
        let x = Tensor::randn(0f32, 1.0, (4, 6), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let (grads, order) = blockwise_grads(&m, &x, Mode::EVAL, &Checkpointing::None);
        assert_eq!(order, vec![2, 1, 0], "blocks are reported last to first");
        assert_close(&grads, &reference_grads(&m, &x), tol);
    }
}

#[test]
fn checkpointing_gives_same_grads_updates_stats_once_and_saves_memory() {
    let plain = model(DType::F64, &[8, 16, 16, 4]);
    let ckpt = model(DType::F64, &[8, 16, 16, 4]);
    ckpt.store().copy_from(plain.store()).unwrap();
    let x = Tensor::randn(0f64, 1.0, (32, 8), &Device::Cpu).unwrap();

    let bytes_plain = tape::forward(&plain, &x, Mode::EVAL, &Checkpointing::None)
        .unwrap()
        .saved_activation_bytes();
    let bytes_ckpt = tape::forward(&plain, &x, Mode::EVAL, &Checkpointing::All)
        .unwrap()
        .saved_activation_bytes();
    assert!(
        bytes_ckpt < bytes_plain,
        "checkpointed {bytes_ckpt} B >= plain {bytes_plain} B"
    );

    let (g_plain, _) = blockwise_grads(&plain, &x, Mode::TRAIN, &Checkpointing::None);
    let (g_ckpt, order) = blockwise_grads(&ckpt, &x, Mode::TRAIN, &Checkpointing::All);
    assert_eq!(order, vec![2, 1, 0]);
    assert_close(&g_ckpt, &g_plain, 1e-12);
    for name in [
        "block0.running_mean",
        "block1.running_mean",
        "block2.running_mean",
    ] {
        let a = plain
            .store()
            .get(name)
            .unwrap()
            .tensor()
            .to_scalar::<f64>()
            .unwrap();
        let b = ckpt
            .store()
            .get(name)
            .unwrap()
            .tensor()
            .to_scalar::<f64>()
            .unwrap();
        assert!(a != 0.0);
        assert_eq!(a, b, "{name} updated a different number of times");
    }
}

#[test]
fn partial_checkpointing_matches() {
    let m = model(DType::F64, &[5, 7, 7, 3]);
    let x = Tensor::randn(0f64, 1.0, (3, 5), &Device::Cpu).unwrap();
    let (g, _) = blockwise_grads(&m, &x, Mode::EVAL, &Checkpointing::Blocks(vec![0, 2]));
    assert_close(&g, &reference_grads(&m, &x), 1e-12);
}
