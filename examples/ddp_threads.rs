//! A data-parallel training loop written directly against the weft crates, ranks as threads:
//! `cargo run --release -p weft-examples --example ddp_threads`.

use std::sync::Arc;

use anyhow::Result;
use candle_core::{DType, Device};
use weft_collectives::{Communicator, ShmCommunicator};
use weft_data::{DataLoader, Dataset, DistributedSampler, LoaderConfig, Pipeline, SyntheticShapes};
use weft_models::{loss, resnet, ResNetConfig};
use weft_optim::{Optimizer, Sgd, SgdConfig};
use weft_parallel::{DdpConfig, DistributedDataParallel, GradientSync};
use weft_tensor::{tape, Checkpointing, FlatBuffer, FlatLayout, Mode};

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
    let layout = FlatLayout::parameters(model.store());
    let params = FlatBuffer::from_store(model.store(), layout.clone(), DType::F32)?;
    let grads = FlatBuffer::zeros(layout, DType::F32, &Device::Cpu)?;
    let mut ddp = DistributedDataParallel::new(model.store(), &grads, comm, DdpConfig::default())?;
    let mut sgd = Sgd::new(SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        ..SgdConfig::default()
    })?;

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
        ddp.before_forward(model.store())?;
        let tape = tape::forward(&model, &images, Mode::TRAIN, &Checkpointing::None)?;
        let batch_loss = loss::cross_entropy(tape.output(), &labels)?;
        let loss_value: f32 = batch_loss.to_scalar()?;
        tape.backward(&batch_loss, &model, |ready| -> weft_parallel::Result<()> {
            let ids: Vec<_> = ready.grads.iter().map(|(id, _)| *id).collect();
            for (id, grad) in ready.grads {
                let slot = grads
                    .layout()
                    .slot_of(id)
                    .expect("every parameter has a slot");
                grads.write(slot, &grad.expect("every parameter is used"))?;
            }
            ddp.block_ready(&ids, &grads)
        })?;
        ddp.finish(&grads)?;
        let mut result = Ok(());
        params.update_with(
            &grads,
            0..grads.layout().len(),
            |p: &mut [f32], g: &[f32]| result = sgd.step(p, g),
        )?;
        result?;
        params.copy_to_store(model.store())?;
        if rank == 0 && step % 10 == 0 {
            println!("step {step}: loss on rank 0's batch {loss_value:.4}");
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
