//! The README's example: a short training loop of a ResNet on the CPU with weft's crates
//! (`cargo run --release -p weft-examples --example train_loop`). Its body between the
//! `readme` markers is the README's code block, word for word (a test checks it).

use candle_core::{DType, Device, Tensor};
use weft_models::loss::Classification;
use weft_models::{resnet, ResNetConfig};
use weft_optim::{ModelOptimizer, OptimizerConfig, ParamGroups, SgdConfig};
use weft_parallel::Trainer;
use weft_tensor::Checkpointing;

fn main() -> anyhow::Result<()> {
    // readme: begin
    let device = Device::Cpu;
    let model = resnet(
        &ResNetConfig::from_name("resnet20", 10)?,
        DType::F32,
        &device,
    )?;
    let sgd = OptimizerConfig::Sgd(SgdConfig {
        momentum: 0.9,
        weight_decay: 5e-4,
        ..SgdConfig::default()
    });
    let optimizer = ModelOptimizer::new(sgd, ParamGroups::default(), &device, DType::F32)?;
    let mut trainer = Trainer::new(
        model,
        Box::new(Classification),
        optimizer,
        Checkpointing::None,
    )?;
    // Data parallelism: .with_strategy(Box::new(DistributedDataParallel::new(trainer.model(),
    // trainer.grads(), communicator, DdpConfig::default())?))?
    let images = Tensor::randn(0f32, 1.0, (16, 3, 32, 32), &device)?;
    let labels = Tensor::from_vec((0..16u32).map(|i| i % 10).collect(), 16, &device)?;
    for step in 0..5 {
        let outcome = trainer.step(&images, &labels, 0.05)?;
        println!(
            "step {step}: loss {:.4}, {} of 16 correct",
            outcome.loss,
            outcome.metric("correct")
        );
    }
    // readme: end
    Ok(())
}
