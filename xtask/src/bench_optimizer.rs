//! `cargo xtask bench-optimizer`: the optimizer step alone over a model's parameters (random
//! gradients), beside PyTorch's fastest optimizer in the same call (`fused=True` on a GPU) and
//! the device's copy bandwidth: time per step, the bytes a step must move (AdamW: parameter,
//! gradient and both moments read, moments and parameter written, 28 bytes per fp32
//! parameter; SGD with momentum 20) and that traffic's bandwidth as a share of the copy's.

use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use clap::Args;
use weft_models::{resnet, ResNetConfig};
use weft_optim::{AdamWConfig, ModelOptimizer, OptimizerConfig, ParamGroups, SgdConfig};
use weft_tensor::{FlatBuffer, FlatLayout};
use weft_train::args::OptimizerKind;

use crate::python;

#[derive(Debug, Args)]
pub struct BenchOptimizerArgs {
    /// Whose parameters to step (any ResNet name)
    #[arg(long, default_value = "resnet50")]
    model: String,
    #[arg(long, value_enum, default_value_t = OptimizerKind::Adamw)]
    optimizer: OptimizerKind,
    /// Timed steps (after the warm-up steps)
    #[arg(long, default_value_t = 50)]
    steps: usize,
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Skip the PyTorch anchor
    #[arg(long, default_value_t = false)]
    no_anchor: bool,
}

/// Bytes one step moves per fp32 parameter.
fn bytes_per_parameter(optimizer: OptimizerKind) -> usize {
    match optimizer {
        OptimizerKind::Adamw => 28,
        OptimizerKind::Sgd => 20,
    }
}

fn config(optimizer: OptimizerKind) -> OptimizerConfig {
    match optimizer {
        OptimizerKind::Adamw => OptimizerConfig::AdamW(AdamWConfig {
            lr: 1e-3,
            ..AdamWConfig::default()
        }),
        OptimizerKind::Sgd => OptimizerConfig::Sgd(SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 1e-4,
            ..SgdConfig::default()
        }),
    }
}

pub fn run(args: &BenchOptimizerArgs) -> Result<()> {
    let device = weft_train::device::parse_device(&args.device)?.open()?;
    let model = resnet(
        &ResNetConfig::from_name(&args.model, 1000)?,
        DType::F32,
        &device,
    )?;
    let store = model.store();
    let layout = FlatLayout::parameters(store);
    let n = layout.len();
    let grads = FlatBuffer::zeros(layout.clone(), DType::F32, &device)?;
    grads
        .tensor()
        .slice_set(&Tensor::randn(0f32, 1e-2, n, &device)?, 0, 0)?;
    let mut optimizer = ModelOptimizer::new(
        config(args.optimizer),
        ParamGroups::default(),
        &device,
        DType::F32,
    )?;
    let master = match optimizer.needs_master_copy() {
        true => Some(layout.read_range(store, 0..n, DType::F32)?),
        false => None,
    };
    let mut timed = 0.0;
    for i in 0..args.warmup + args.steps {
        if i == args.warmup {
            device.synchronize()?;
            timed = 0.0;
        }
        let start = Instant::now();
        optimizer.step(master.as_ref(), &grads, store, 0..n, None)?;
        if i >= args.warmup && i + 1 == args.warmup + args.steps {
            device.synchronize()?;
        }
        timed += start.elapsed().as_secs_f64();
    }
    let per_step = timed / args.steps as f64;
    let bytes = (n * bytes_per_parameter(args.optimizer)) as f64;
    let copy = copy_bandwidth(&device)?;
    let achieved = bytes / per_step / 1e9;
    println!(
        "weft {:?} over {} ({n} parameters) on {}: {:.3} ms/step, {:.0} GB/s of optimizer traffic ({} B/parameter) = {:.0}% of the device copy's {:.0} GB/s",
        args.optimizer,
        args.model,
        args.device,
        per_step * 1e3,
        achieved,
        bytes_per_parameter(args.optimizer),
        100.0 * achieved / copy,
        copy
    );
    if !args.no_anchor {
        let torch = measure_torch(args)?;
        println!(
            "pytorch {}: {:.3} ms/step; weft/pytorch time {:.2}",
            torch.0,
            torch.1 * 1e3,
            per_step / torch.1
        );
    }
    Ok(())
}

/// The device's copy bandwidth (bytes read plus written per second, GB/s) over 512 MiB.
fn copy_bandwidth(device: &Device) -> Result<f64> {
    let n = 128 << 20;
    let source = Tensor::zeros(n, DType::F32, device)?;
    let mut best = f64::MAX;
    for _ in 0..5 {
        device.synchronize()?;
        let start = Instant::now();
        let copy = source.copy()?;
        device.synchronize()?;
        best = best.min(start.elapsed().as_secs_f64());
        drop(copy);
    }
    Ok(2.0 * (n * 4) as f64 / best / 1e9)
}

/// PyTorch's fastest configuration of the optimizer (its name, seconds per step).
fn measure_torch(args: &BenchOptimizerArgs) -> Result<(String, f64)> {
    let output = Command::new(python::torch_python()?)
        .arg(python::script("bench_optimizer.py"))
        .args(["--model", &args.model])
        .args(["--steps", &args.steps.to_string()])
        .args(["--warmup", &args.warmup.to_string()])
        .args(["--device", &args.device])
        .args([
            "--optimizer",
            match args.optimizer {
                OptimizerKind::Sgd => "sgd",
                OptimizerKind::Adamw => "adamw",
            },
        ])
        .output()
        .context("cannot run the PyTorch anchor")?;
    if !output.status.success() {
        bail!(
            "PyTorch anchor failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().last().unwrap_or_default();
    let json: serde_json::Value =
        serde_json::from_str(line).with_context(|| format!("anchor printed no JSON: {line}"))?;
    let name = json["best"].as_str().unwrap_or("?").to_string();
    let seconds = json["step_s"]
        .as_f64()
        .context("anchor output lacks step_s")?;
    Ok((name, seconds))
}
