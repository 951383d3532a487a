//! One optimizer step of a block model: block-wise forward, cross-entropy loss, block-wise
//! backward copying each block's gradients into the flat gradient buffer the moment they are
//! final, then one fused optimizer update over the flat parameter buffer.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use candle_core::{DType, Tensor};
use weft_models::loss;
use weft_optim::Optimizer;
use weft_tensor::{tape, BlockModel, Checkpointing, FlatBuffer, FlatLayout, Mode};

/// Where the time of one step went.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepTimings {
    pub forward: Duration,
    pub backward: Duration,
    pub optimizer: Duration,
}

/// What one step measured.
#[derive(Debug, Clone, Copy)]
pub struct StepOutcome {
    /// Mean loss of the batch, before the update.
    pub loss: f64,
    /// Correct top-1 predictions in the batch.
    pub correct: usize,
    pub timings: StepTimings,
}

/// A model with its flat master parameters, flat gradients and optimizer.
pub struct Trainer {
    model: BlockModel,
    params: FlatBuffer,
    grads: FlatBuffer,
    optimizer: Box<dyn Optimizer + Send>,
    checkpointing: Checkpointing,
}

impl Trainer {
    /// Flattens `model`'s parameters (f32 master copy) for `optimizer`.
    pub fn new(
        model: BlockModel,
        optimizer: Box<dyn Optimizer + Send>,
        checkpointing: Checkpointing,
    ) -> Result<Self> {
        let layout = FlatLayout::parameters(model.store());
        let params = FlatBuffer::from_store(model.store(), layout.clone(), DType::F32)?;
        let grads = FlatBuffer::zeros(layout, DType::F32, model.store().device())?;
        Ok(Self {
            model,
            params,
            grads,
            optimizer,
            checkpointing,
        })
    }

    pub fn model(&self) -> &BlockModel {
        &self.model
    }

    /// Trains on one batch (`images` NCHW, `labels` u32) with learning rate `lr`.
    pub fn step(&mut self, images: &Tensor, labels: &Tensor, lr: f64) -> Result<StepOutcome> {
        let start = Instant::now();
        let tape = tape::forward(&self.model, images, Mode::TRAIN, &self.checkpointing)?;
        let logits = tape.output().clone();
        let batch_loss = loss::cross_entropy(&logits, labels)?;
        let forward = start.elapsed();

        let start = Instant::now();
        let (model, grads) = (&self.model, &self.grads);
        tape.backward(&batch_loss, model, |ready| {
            for (id, grad) in ready.grads {
                let name = &model.store().entries()[id].name;
                let grad = grad.ok_or_else(|| weft_tensor::TensorError::Block {
                    block: model.blocks()[ready.block].name().into(),
                    message: format!("parameter `{name}` received no gradient"),
                })?;
                let slot = grads
                    .layout()
                    .slot_of(id)
                    .expect("every parameter has a slot");
                grads.write(slot, &grad)?;
            }
            Ok(())
        })?;
        let backward = start.elapsed();

        let start = Instant::now();
        self.optimizer.set_lr(lr)?;
        let optimizer = &mut self.optimizer;
        let mut result = Ok(());
        self.params
            .update_with(&self.grads, 0..self.params.layout().len(), |p, g| {
                result = optimizer.step(p, g)
            })?;
        result.map_err(|e| anyhow!("optimizer step: {e}"))?;
        self.params.copy_to_store(self.model.store())?;
        let optimizer = start.elapsed();

        Ok(StepOutcome {
            loss: batch_loss.to_dtype(DType::F64)?.to_scalar()?,
            correct: loss::correct_predictions(&logits, labels)?,
            timings: StepTimings {
                forward,
                backward,
                optimizer,
            },
        })
    }

    /// Loss sum and correct predictions on one batch in evaluation mode (no gradients kept).
    pub fn evaluate(&self, images: &Tensor, labels: &Tensor) -> Result<(f64, usize)> {
        let logits = self.model.forward(images, Mode::EVAL)?.detach();
        let mean_loss: f64 = loss::cross_entropy(&logits, labels)?
            .to_dtype(DType::F64)?
            .to_scalar()?;
        Ok((
            mean_loss * labels.elem_count() as f64,
            loss::correct_predictions(&logits, labels)?,
        ))
    }

    /// Re-reads the model's parameters into the flat master copy (after loading weights).
    pub fn reload_parameters(&self) -> Result<()> {
        Ok(self.params.copy_from_store(self.model.store())?)
    }
}
