//! A parameter that takes no part in the loss is reported by name, not waited for: in one
//! process, and on every rank of a data-parallel job (where waiting for its gradient's
//! all-reduce would hang).

use std::ops::Range;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var};
use weft_collectives::ShmCommunicator;
use weft_models::loss::Classification;
use weft_optim::ModelOptimizer;
use weft_optim::{Sgd, SgdConfig};
use weft_parallel::Trainer;
use weft_parallel::{DdpConfig, DistributedDataParallel};
use weft_tensor::{Block, BlockModel, Checkpointing, EntryId, Mode, ParamStore};

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

/// A one-block model whose `linear.unused` parameter never enters the loss.
fn trainer() -> Trainer {
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
    let model = BlockModel::new(store, vec![Box::new(Linear { weight, entries })]).unwrap();
    let sgd = Sgd::new(SgdConfig {
        lr: 0.1,
        ..SgdConfig::default()
    })
    .unwrap();
    Trainer::new(
        model,
        Box::new(Classification),
        ModelOptimizer::host_f32(sgd),
        Checkpointing::None,
    )
    .unwrap()
}

fn step_error(trainer: &mut Trainer) -> String {
    let x = Tensor::ones((2, 4), DType::F32, &Device::Cpu).unwrap();
    let y = Tensor::new(&[0u32, 1], &Device::Cpu).unwrap();
    trainer.step(&x, &y, 0.1).unwrap_err().to_string()
}

#[test]
fn unused_parameter_is_named() {
    let err = step_error(&mut trainer());
    assert!(err.contains("`linear.unused`"), "{err}");
}

#[test]
fn unused_parameter_is_named_on_every_rank_of_a_ddp_job() {
    let comms = ShmCommunicator::new_thread_group(2).unwrap();
    let errors: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                scope.spawn(move || {
                    let plain = trainer();
                    let ddp = DistributedDataParallel::new(
                        plain.model(),
                        plain.grads(),
                        Arc::new(comm),
                        DdpConfig::default(),
                    )
                    .unwrap();
                    step_error(&mut plain.with_strategy(Box::new(ddp)).unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, err) in errors.iter().enumerate() {
        assert!(err.contains("`linear.unused`"), "rank {rank}: {err}");
        assert!(!err.contains("linear.weight"), "rank {rank}: {err}");
    }
}

#[test]
fn under_zero_2_the_unused_parameter_is_named_or_reduced_as_zero() {
    for find_unused_parameters in [false, true] {
        let results = weft_testing::on_thread_ranks(2, |_, comm| {
            let plain = trainer();
            let config = DdpConfig {
                find_unused_parameters,
                ..DdpConfig::default()
            };
            let zero = weft_parallel::zero::zero_stage2(plain.model(), plain.grads(), comm, config)
                .unwrap();
            let mut t = plain.with_strategy(Box::new(zero)).unwrap();
            let x = Tensor::ones((2, 4), DType::F32, &Device::Cpu).unwrap();
            let y = Tensor::new(&[0u32, 1], &Device::Cpu).unwrap();
            t.step(&x, &y, 0.1)
                .map(|_| weft_testing::flat_params(t.model().store()))
        });
        for (rank, result) in results.iter().enumerate() {
            match (find_unused_parameters, result) {
                (false, Err(e)) => assert!(
                    e.to_string().contains("`linear.unused`"),
                    "rank {rank}: {e}"
                ),
                (true, Ok(params)) => {
                    assert_eq!(params[12..], [1.0, 1.0], "rank {rank}: unused stays")
                }
                (_, other) => panic!(
                    "rank {rank}, find_unused_parameters {find_unused_parameters}: {other:?}"
                ),
            }
        }
    }
}
