//! The GPT end to end on the GPU against the CPU in f64: three AdamW steps of a small GPT
//! (head width 4, two layers, a padded vocabulary) through the trainer, every op of it on its
//! CUDA path (fused attention, LayerNorm, GELU, the cross-entropy over the padded vocabulary, the
//! device optimizer) — the losses and the parameters after the steps.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_models::gpt::{gpt, GptConfig};
use weft_models::loss::NextToken;
use weft_optim::{AdamWConfig, ModelOptimizer, OptimizerConfig, ParamGroups};
use weft_parallel::{SingleProcess, Trainer};
use weft_tensor::Checkpointing;

fn config() -> Result<GptConfig> {
    let mut config = GptConfig::from_name("gpt-tiny")?;
    (config.vocab_size, config.vocab_multiple, config.n_embd) = (13, 8, 16);
    (config.n_head, config.n_layer, config.context) = (4, 2, 40);
    Ok(config.with_seed(3))
}

/// Largest relative differences of the losses and of the parameters after three steps.
pub(super) fn compare_gpt_training(gpu: &Device) -> Result<(f64, f64)> {
    let config = config()?;
    let run = |device: &Device| -> Result<(Vec<f64>, Vec<f64>)> {
        let model = gpt(&config, DType::F64, device)?;
        let adamw = OptimizerConfig::AdamW(AdamWConfig {
            lr: 0.01,
            weight_decay: 0.1,
            ..AdamWConfig::default()
        });
        let optimizer = ModelOptimizer::new(adamw, ParamGroups::default(), device, DType::F64)?;
        let objective = NextToken { vocab_size: 13 };
        let t = Trainer::new(model, Box::new(objective), optimizer, Checkpointing::None)?;
        let single = SingleProcess::new(t.model(), false);
        let mut t = t.with_strategy(Box::new(single))?;
        let mut losses = Vec::new();
        for step in 0..3u32 {
            let tokens = |shift: u32| -> Result<Tensor> {
                let v: Vec<u32> = (0..3 * 40u32)
                    .map(|i| (i * 7 + step * 5 + shift + i * i / 3) % 13)
                    .collect();
                Ok(Tensor::from_vec(v, (3, 40), device)?)
            };
            losses.push(t.step(&tokens(0)?, &tokens(1)?, 0.01)?.loss);
        }
        let mut params = Vec::new();
        for entry in t.model().store().entries() {
            let values = entry.tensor().flatten_all()?.to_device(&Device::Cpu)?;
            params.extend(values.to_vec1::<f64>()?);
        }
        Ok((losses, params))
    };
    let (cpu, on_gpu) = (run(&Device::Cpu)?, run(gpu)?);
    let relative = |a: &[f64], b: &[f64]| {
        let scale = a.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
        a.iter()
            .zip(b)
            .fold(0f64, |m, (x, y)| m.max((x - y).abs() / scale))
    };
    Ok((relative(&cpu.0, &on_gpu.0), relative(&cpu.1, &on_gpu.1)))
}
