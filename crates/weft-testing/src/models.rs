//! Tiny models for tests: a two-stage basic-block ResNet on 6x6 images, and a three-block
//! model whose first and last blocks share a weight (tied embedding and head), with an
//! optional parameter that never enters the loss.

use std::ops::Range;

use candle_core::{DType, Device, Tensor, Var};
use weft_models::resnet::{BlockKind, ResNetConfig, StemKind};
use weft_tensor::{Block, BlockModel, EntryId, Mode, ParamStore};

/// A CIFAR-stem ResNet with one basic block per stage, 4 and 8 channels.
pub fn tiny_resnet_config(seed: u64, classes: usize) -> ResNetConfig {
    ResNetConfig {
        block: BlockKind::Basic,
        layers: vec![1, 1],
        stem_width: 4,
        widths: vec![4, 8],
        stem: StemKind::Cifar,
        num_classes: classes,
        zero_init_residual: false,
        seed,
        channels_last: false,
    }
}

/// [`tiny_resnet_config`] built on the CPU in `dtype`.
pub fn tiny_resnet(seed: u64, classes: usize, dtype: DType) -> BlockModel {
    weft_models::resnet(&tiny_resnet_config(seed, classes), dtype, &Device::Cpu)
        .expect("the tiny ResNet builds")
}

/// `tanh(x W^T)`, or `x E` with another block's weight (`shared`): a head tied to the
/// embedding.
struct Dense {
    name: String,
    weight: Var,
    entries: Range<EntryId>,
    shared: Vec<EntryId>,
    head: bool,
}

impl Block for Dense {
    fn name(&self) -> &str {
        &self.name
    }

    fn forward(&self, x: &Tensor, _mode: Mode) -> weft_tensor::Result<Tensor> {
        if self.head {
            Ok(x.matmul(self.weight.as_tensor())?)
        } else {
            Ok(x.matmul(&self.weight.t()?)?.tanh()?)
        }
    }

    fn entries(&self) -> Range<EntryId> {
        self.entries.clone()
    }

    fn shared_parameters(&self) -> Vec<EntryId> {
        self.shared.clone()
    }
}

/// Three blocks over inputs of 4 features and 4 classes: `embed` (`tanh(x E^T)`, E 6x4),
/// `middle` (6x6, plus an `unused` parameter when `with_unused`), `head` (logits `h E`,
/// sharing `embed.weight`). Deterministic weights from `seed`, in `dtype` on the CPU.
pub fn tied_model(seed: u64, dtype: DType, with_unused: bool) -> BlockModel {
    let dev = Device::Cpu;
    let mut store = ParamStore::new(&dev, dtype);
    let value = |rows: usize, cols: usize, salt: u64| {
        let values: Vec<f64> = (0..rows * cols)
            .map(|i| {
                let k = (i as u64 + 1) * 2_654_435_761 + (seed + 1) * 40_503 + salt * 977;
                ((k % 2001) as f64 / 1000.0 - 1.0) * 0.5
            })
            .collect();
        Tensor::from_vec(values, (rows, cols), &dev)
            .and_then(|t| t.to_dtype(dtype))
            .expect("a small tensor")
    };
    let mut scope = store.scope("embed");
    let embed = scope.parameter("weight", value(6, 4, 1)).unwrap();
    let embed_entries = 0..scope.store_len();
    let mut scope = store.scope("middle");
    let start = scope.store_len();
    let middle = scope.parameter("weight", value(6, 6, 2)).unwrap();
    if with_unused {
        scope.parameter("unused", value(1, 3, 3)).unwrap();
    }
    let middle_entries = start..scope.store_len();
    let end = middle_entries.end;
    let blocks: Vec<Box<dyn Block>> = vec![
        Box::new(Dense {
            name: "embed".into(),
            weight: embed.clone(),
            entries: embed_entries,
            shared: vec![],
            head: false,
        }),
        Box::new(Dense {
            name: "middle".into(),
            weight: middle,
            entries: middle_entries,
            shared: vec![],
            head: false,
        }),
        Box::new(Dense {
            name: "head".into(),
            weight: embed,
            entries: end..end,
            shared: vec![0],
            head: true,
        }),
    ];
    BlockModel::new(store, blocks).expect("a valid tied model")
}

/// Inputs of 4 features and labels of 4 classes for [`tied_model`]: `n` samples,
/// deterministic per `step`.
pub fn tied_batch(n: usize, step: usize) -> (Tensor, Tensor) {
    let x: Vec<f64> = (0..n * 4)
        .map(|i| ((i * 37 + step * 11) % 17) as f64 / 8.0 - 1.0)
        .collect();
    let y: Vec<u32> = (0..n).map(|i| ((i + step) % 4) as u32).collect();
    (
        Tensor::from_vec(x, (n, 4), &Device::Cpu).expect("a small tensor"),
        Tensor::from_vec(y, n, &Device::Cpu).expect("a small tensor"),
    )
}
