//! The PyTorch side of `bench-ddp` on GPUs: `xtask/python/ddp_anchor.py` (torchvision's
//! ResNet-50 under `DistributedDataParallel` over NCCL) on the same GPU counts, batch, steps,
//! precision, compression and layout as weft's runs, eager or compiled.

use std::process::Command;

use anyhow::{bail, Context, Result};

use super::BenchDdpArgs;

/// A configuration of the PyTorch anchor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Variant {
    /// Eager DDP, the SGD's foreach kernels (PyTorch's defaults).
    Eager,
    /// `torch.compile` over the DDP model (Dynamo's DDP optimizer splits the graph at the
    /// buckets) and the fused SGD: PyTorch's fastest data-parallel step.
    Compile,
}

impl Variant {
    /// The name of its phase and of its rows.
    pub fn phase(self) -> &'static str {
        match self {
            Variant::Eager => "torch",
            Variant::Compile => "torch-compile",
        }
    }
}

/// Images/s of the anchor per world size.
pub struct Rates(Vec<serde_json::Value>);

impl Rates {
    /// The global images/s on `world` GPUs (NaN when the anchor did not run that size).
    pub fn images_per_sec(&self, world: usize) -> f64 {
        self.0
            .iter()
            .find(|v| v["world_size"].as_u64() == Some(world as u64))
            .and_then(|v| v["images_per_sec"].as_f64())
            .unwrap_or(f64::NAN)
    }
}

/// Runs the anchor in `variant` on each of `worlds` GPUs, printing its JSON lines.
pub fn run(args: &BenchDdpArgs, variant: Variant, worlds: &[usize]) -> Result<Rates> {
    let python = crate::python::torch_python()?;
    let worlds: Vec<String> = worlds.iter().map(usize::to_string).collect();
    let output = Command::new(python)
        .arg(crate::python::script("ddp_anchor.py"))
        .args(["--world-sizes", &worlds.join(",")])
        .args(["--batch-per-gpu", &args.batch_size.to_string()])
        .args(["--steps", &(args.steps - args.warmup).to_string()])
        .args(["--warmup", &args.warmup.to_string()])
        .args(["--amp", amp_of(&args.precision)?])
        .args(["--compress", &args.grad_compression])
        .args(args.channels_last.then_some("--channels-last"))
        .args(args.sync_bn.then_some("--sync-bn"))
        .args((variant == Variant::Compile).then_some("--compile"))
        .output()
        .context("cannot run the PyTorch DDP anchor")?;
    if !output.status.success() {
        bail!(
            "PyTorch DDP anchor ({}) failed: {}",
            variant.phase(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    for line in &lines {
        println!("anchor {line}");
    }
    Ok(Rates(lines))
}

/// The anchor's autocast dtype for weft's precision policy `precision`.
fn amp_of(precision: &str) -> Result<&'static str> {
    Ok(match precision {
        "fp32" => "none",
        "bf16-mixed" => "bf16",
        "fp16-mixed" => "fp16",
        other => bail!(
            "--precision {other}: the anchor has no counterpart (fp32, bf16-mixed, fp16-mixed)"
        ),
    })
}
