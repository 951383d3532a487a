//! A parameter that takes no part in the loss is reported by name, not waited for.

use std::ops::Range;

use candle_core::{DType, Device, Tensor, Var};
use weft_optim::{Sgd, SgdConfig};
use weft_tensor::{Block, BlockModel, Checkpointing, EntryId, Mode, ParamStore};
use weft_train::step::{FlatOptimizer, Trainer};

/// `x W^T`, with a registered `unused` parameter that never enters the computation.
struct Linear {
    weight: Var,
    entries: Range<EntryId>,
}

impl Block for Linear {
    fn name(&self) -> &str {
        "linear"
    }

    fn forward(&self, x: &Tensor, _mode: Mode) -> weft_tensor::Result<Tensor> {
        Ok(x.matmul(&self.weight.t()?)?)
    }

    fn entries(&self) -> Range<EntryId> {
        self.entries.clone()
    }
}

#[test]
fn unused_parameter_is_named() {
    let dev = Device::Cpu;
    let mut store = ParamStore::new(&dev, DType::F32);
    let mut scope = store.scope("linear");
    let weight = scope
        .parameter("weight", Tensor::ones((3, 4), DType::F32, &dev).unwrap())
        .unwrap();
    scope
        .parameter("unused", Tensor::ones(2, DType::F32, &dev).unwrap())
        .unwrap();
    let entries = 0..scope.store_len();
    let model = BlockModel::new(store, vec![Box::new(Linear { weight, entries })]);
    let sgd = Sgd::new(SgdConfig {
        lr: 0.1,
        ..SgdConfig::default()
    })
    .unwrap();
    let mut trainer = Trainer::new(
        model,
        FlatOptimizer::F32(Box::new(sgd)),
        Checkpointing::None,
    )
    .unwrap();
    let x = Tensor::ones((2, 4), DType::F32, &dev).unwrap();
    let y = Tensor::new(&[0u32, 1], &dev).unwrap();
    let err = trainer.step(&x, &y, 0.1).unwrap_err().to_string();
    assert!(err.contains("`linear.unused`"), "{err}");
}
