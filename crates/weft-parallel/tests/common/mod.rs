//! The set-up several integration tests share: a classifier trained by SGD in f64.

use weft_models::loss::Classification;
use weft_optim::{ModelOptimizer, Sgd, SgdConfig};
use weft_parallel::Trainer;
use weft_tensor::{BlockModel, Checkpointing};

/// `model` trained for classification by SGD (learning rate 0.1, `momentum`, `weight_decay`)
/// stepping an f64 master copy on the host, without activation checkpointing.
pub fn sgd_classifier(model: BlockModel, momentum: f64, weight_decay: f64) -> Trainer {
    let sgd = Sgd::<f64>::new(SgdConfig {
        lr: 0.1,
        momentum,
        weight_decay,
        ..SgdConfig::default()
    })
    .unwrap();
    Trainer::new(
        model,
        Box::new(Classification),
        ModelOptimizer::host_f64(sgd),
        Checkpointing::None,
    )
    .unwrap()
}
