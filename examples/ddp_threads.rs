//! A data-parallel training loop with the weft crates, ranks as threads over the shared-memory
//! backend:
//! `cargo run --release -p weft-examples --example ddp_threads`.

use std::sync::Arc;

use anyhow::Result;
use candle_core::{DType, Device};
use weft_collectives::{Communicator, ShmCommunicator};
use weft_data::{DataLoader, Dataset, DistributedSampler, LoaderConfig, Pipeline, SyntheticShapes};
use weft_models::loss::Classification;
use weft_models::{resnet, ResNetConfig};
use weft_optim::{ModelOptimizer, Sgd, SgdConfig};
use weft_parallel::Trainer;
use weft_tensor::Checkpointing;
use weft_train::parallelize::{self, ResNetParallelism};

const WORLD: usize = 2;
const BATCH_PER_RANK: usize = 32;
const STEPS: usize = 40;

fn train_rank(comm: Arc<dyn Communicator>) -> Result<()> {
    let rank = comm.rank();
    let model = resnet(
        &ResNetConfig::from_name("resnet20", 10)?,
        DType::F32,
        &Device::Cpu,
    )?;
    let sgd = Sgd::new(SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        ..SgdConfig::default()
    })?;
    let trainer = Trainer::new(
        model,
        Box::new(Classification),
        ModelOptimizer::host_f32(sgd),
        Checkpointing::None,
    )?;
    // The ResNet's set-up, as the trainer does it: DistributedDataParallel over the ranks
    // (rank 0's parameters broadcast, gradient buckets planned over the flat buffer).
    let mut trainer = parallelize::resnet(trainer, Some(&comm), &ResNetParallelism::default())?;

    let data = Arc::new(SyntheticShapes::train(WORLD * BATCH_PER_RANK * STEPS, 0));
    let sampler = DistributedSampler::new(data.len(), WORLD, rank)?;
    let config = LoaderConfig {
        batch_size: BATCH_PER_RANK,
        drop_last: true,
        ..LoaderConfig::default()
    };
    let loader = DataLoader::new(
        data,
        Arc::new(Pipeline::cifar_train(32)),
        sampler.indices(),
        config,
    )?;
    for (step, batch) in loader.enumerate() {
        let (images, labels) = batch?.to_tensors(&Device::Cpu)?;
        // Forward, backward with each bucket all-reduced as soon as its gradients are final,
        // then the SGD update.
        let outcome = trainer.step(&images, &labels, 0.05)?;
        if rank == 0 && step % 10 == 0 {
            println!(
                "step {step}: loss on rank 0's batch {:.4}, {} of {} correct",
                outcome.loss,
                outcome.metric("correct"),
                outcome.samples
            );
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let comms = ShmCommunicator::new_thread_group(WORLD)?;
    std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| scope.spawn(move || train_rank(Arc::new(c))))
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("rank thread panicked"))
    })
}
