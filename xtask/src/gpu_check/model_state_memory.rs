//! The device memory a bf16-mixed training step leaves held between steps against the model
//! states the trainer counts (what `memory-plan` predicts): parameters, fp32 gradients, the
//! device AdamW's fp32 master weights and moments. Anything else held is memory no plan sees
//! (a copy kept alive through Candle's graph held Ψ × 4 bytes more until the thirty-third
//! session).

use anyhow::Result;
use candle_core::{Device, Tensor};
use weft_models::gpt::{gpt, GptConfig};
use weft_models::loss::NextToken;
use weft_precision::PrecisionPolicy;
use weft_train::optim_setup::OptimizerSettings;
use weft_train::step_engine::{self, StepSettings};

/// `(held − counted) / counted` after two steps of a bf16 GPT with AdamW on the GPU, `held` the
/// growth of the memory pool's bytes in use from before the model was built.
pub(super) fn untracked_share(gpu: &Device) -> Result<f64> {
    let used = || -> Result<f64> {
        gpu.synchronize()?;
        let usage = weft_tensor::cuda_runtime::memory_usage(gpu)?;
        Ok(usage.map_or(0.0, |u| u.used as f64))
    };
    let before = used()?;
    let mut config = GptConfig::from_name("gpt-tiny")?.with_seed(2);
    (config.n_embd, config.n_head, config.n_layer, config.context) = (1024, 8, 4, 128);
    let policy = PrecisionPolicy::from_name("bf16-mixed")?;
    let model = gpt(&config, policy.param, gpu)?;
    let objective = NextToken {
        vocab_size: config.vocab_size,
    };
    let step = StepSettings::new(OptimizerSettings::adamw(1e-4, 0.1), policy);
    let mut trainer = step_engine::assemble(model, Box::new(objective), &step)?;
    let vocab = config.vocab_size as u32;
    let ids: Vec<u32> = (0..4 * 128u32).map(|i| (i * 31 + 7) % vocab).collect();
    let targets: Vec<u32> = ids.iter().map(|i| (i + 1) % vocab).collect();
    let ids = Tensor::from_vec(ids, (4, 128), gpu)?;
    let targets = Tensor::from_vec(targets, (4, 128), gpu)?;
    for _ in 0..2 {
        trainer.step(&ids, &targets, 1e-4)?;
    }
    let held = used()? - before;
    let counted = trainer.model_state_bytes();
    let counted = (counted.parameters
        + counted.gradients
        + counted.master_weights
        + counted.optimizer_states) as f64;
    println!(
        "model states held between steps: {:.1} MiB, counted {:.1} MiB",
        held / 1048576.0,
        counted / 1048576.0
    );
    Ok((held - counted) / counted)
}
