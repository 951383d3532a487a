//! The GPT end to end on the GPU against the CPU in f64: three AdamW steps of a small GPT
//! (head width 4, two layers, a padded vocabulary) through the trainer, every op of it on its
//! CUDA path (fused attention, LayerNorm, GELU, the cross-entropy over the padded vocabulary, the
//! device optimizer) — the losses and the parameters after the steps. Then bf16-mixed against
//! fp32 on the GPU over 20 steps of a GPT with GPT-2's head width (cuDNN's fused attention and
//! the 16-bit kernels on the bf16 side).

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_models::gpt::{gpt, GptConfig};
use weft_models::loss::NextToken;
use weft_optim::{AdamWConfig, ModelOptimizer, OptimizerConfig, ParamGroups};
use weft_parallel::{SingleProcess, Trainer};
use weft_precision::PrecisionPolicy;
use weft_tensor::{ops, Checkpointing};
use weft_train::optim_setup::OptimizerSettings;
use weft_train::step_engine::{self, StepSettings};

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

/// How [`run_d64`] trains: steps, precision, and whether from a CUDA graph launched ahead.
struct D64Run {
    steps: u32,
    precision: &'static str,
    graph: bool,
}

/// What a [`D64Run`] gives: the losses, the parameters after it (widened to f32) and how many
/// steps were replayed from the graph with a step still queued behind.
struct D64Result {
    losses: Vec<f64>,
    params: Vec<f32>,
    queued: usize,
}

/// AdamW steps of a two-layer GPT of width 128 with two heads of 64 (GPT-2's head width: cuDNN's
/// fused attention in 16 bits) on `device`, another batch of a token pattern it learns at
/// every step; with `graph`, each step launched before the one before it is read.
fn run_d64(device: &Device, run: D64Run) -> Result<D64Result> {
    let mut config = GptConfig::from_name("gpt-tiny")?;
    (config.vocab_size, config.vocab_multiple, config.n_embd) = (97, 64, 128);
    (config.n_head, config.n_layer, config.context) = (2, 2, 128);
    let config = config.with_seed(5);
    let policy = PrecisionPolicy::from_name(run.precision)?;
    let model = gpt(&config, policy.param, device)?;
    let step = StepSettings::new(OptimizerSettings::adamw(3e-3, 0.1), policy);
    let objective = NextToken { vocab_size: 97 };
    let t = step_engine::assemble(model, Box::new(objective), &step)?;
    let single = SingleProcess::new(t.model(), false);
    let mut t = t.with_strategy(Box::new(single))?;
    if run.graph {
        t = t.with_cuda_graph();
    }
    let batch = |step: u32, shift: u32| -> Result<Tensor> {
        let v: Vec<u32> = (0..4 * 128u32)
            .map(|i| (i * 5 + shift + i / 7 + step % 3) % 97)
            .collect();
        Ok(Tensor::from_vec(v, (4, 128), device)?)
    };
    let (mut losses, mut queued, mut in_flight) = (Vec::new(), 0, None);
    for step in 0..run.steps {
        let (ids, targets) = (batch(step, 0)?, batch(step, 5)?);
        let launched = t.launch(&ids, &targets, (1, 3e-3))?;
        queued += usize::from(launched.is_queued());
        if let Some(earlier) = in_flight.replace(launched) {
            losses.push(t.finish(earlier)?.loss);
        }
        if !run.graph {
            losses.push(t.finish(in_flight.take().expect("just launched"))?.loss);
        }
    }
    if let Some(last) = in_flight {
        losses.push(t.finish(last)?.loss);
    }
    let mut params = Vec::new();
    for entry in t.model().store().entries() {
        let values = entry.tensor().flatten_all()?.to_dtype(DType::F32)?;
        params.extend(values.to_device(&Device::Cpu)?.to_vec1::<f32>()?);
    }
    Ok(D64Result {
        losses,
        params,
        queued,
    })
}

/// The largest relative difference between bf16-mixed's and fp32's losses over 20 steps on
/// the GPU (both from the same initial weights, the bf16 copy rounded from them).
pub(super) fn compare_bf16_tracking(gpu: &Device) -> Result<f64> {
    let run = |precision| D64Run {
        steps: 20,
        precision,
        graph: false,
    };
    let (fp32, bf16) = (run_d64(gpu, run("fp32"))?, run_d64(gpu, run("bf16-mixed"))?);
    println!("gpu-check: GPT losses fp32 {:.4?}", fp32.losses);
    println!("gpu-check: GPT losses bf16-mixed {:.4?}", bf16.losses);
    Ok(fp32
        .losses
        .iter()
        .zip(&bf16.losses)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs() / a.abs())))
}

/// The largest difference of the parameters (relative to their largest) between two runs.
fn params_error(a: &D64Result, b: &D64Result) -> f64 {
    let scale = a.params.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30) as f64;
    a.params
        .iter()
        .zip(&b.params)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs() as f64 / scale))
}

/// bf16-mixed GPT steps replayed from a CUDA graph and launched ahead against the same steps
/// run eagerly, 8 steps each. With deterministic algorithms (cuDNN's deterministic attention
/// backward) every kernel adds in a fixed order: the parameters' difference must be 0. Without,
/// cuDNN's attention backward accumulates dQ in whatever order its blocks finish: the graph's
/// difference to an eager run is returned beside two eager runs' own difference (the spread),
/// as (deterministic difference, graph difference, eager spread); infinity when fewer than four
/// replays were queued behind a running one.
pub(super) fn compare_graph_replay(gpu: &Device) -> Result<(f64, f64, f64)> {
    let run = |graph| D64Run {
        steps: 8,
        precision: "bf16-mixed",
        graph,
    };
    let was = ops::deterministic();
    ops::set_deterministic(true);
    let (eager, graphed) = (run_d64(gpu, run(false)), run_d64(gpu, run(true)));
    ops::set_deterministic(false);
    let (eager_b, eager_c, graphed_b) = (
        run_d64(gpu, run(false)),
        run_d64(gpu, run(false)),
        run_d64(gpu, run(true)),
    );
    ops::set_deterministic(was);
    let (eager, graphed, eager_b, eager_c, graphed_b) =
        (eager?, graphed?, eager_b?, eager_c?, graphed_b?);
    println!(
        "gpu-check: GPT bf16 CUDA graph: {} and {} of 8 steps queued at launch; losses eager {:.5?}, graph {:.5?}",
        graphed.queued, graphed_b.queued, eager.losses, graphed.losses
    );
    if graphed.queued < 4 || graphed_b.queued < 4 || eager.losses != graphed.losses {
        return Ok((f64::INFINITY, f64::INFINITY, 0.0));
    }
    Ok((
        params_error(&eager, &graphed),
        params_error(&eager_b, &graphed_b),
        params_error(&eager_b, &eager_c),
    ))
}
