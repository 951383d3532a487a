//! `cargo xtask bench-step`: times one training step (forward, backward, SGD update) of a
//! ResNet on random data, then the same step in PyTorch (torchvision model, same batch, same
//! thread count) in the same run, and prints both and their ratio. On a GPU both sides wait
//! for the device at the end of each phase (the step is the wall time from its start to the
//! device having finished it), and both report their peak memory in use by tensors.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Tensor};
use clap::Args;
use weft_models::loss::Classification;
use weft_models::{resnet, ResNetConfig};
use weft_optim::AdamWConfig;
use weft_parallel::StepTimings;
use weft_precision::PrecisionPolicy;
use weft_train::args::ConvStatsFlag;
use weft_train::args::OptimizerKind;
use weft_train::optim_setup::OptimizerSettings;
use weft_train::step_engine::{self, StepSettings};

use crate::python;

#[derive(Debug, Args)]
pub struct BenchStepArgs {
    #[arg(long, default_value = "resnet18")]
    model: String,
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    #[arg(long, default_value_t = 32)]
    image_size: usize,
    /// 3x3 stem convolution and no max-pool (the CIFAR variant of a torchvision ResNet)
    #[arg(long, default_value_t = false)]
    cifar_stem: bool,
    #[arg(long, default_value_t = 10)]
    num_classes: usize,
    /// Timed steps (after the warm-up steps)
    #[arg(long, default_value_t = 3)]
    steps: usize,
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Skip the PyTorch anchor
    #[arg(long, default_value_t = false)]
    no_anchor: bool,
    /// Batch norm, ReLU and max-pool on a GPU: weft's kernels or Candle's ops (to measure the
    /// difference)
    #[arg(long, value_enum, default_value_t = CudaKernels::Weft)]
    cuda_kernels: CudaKernels,
    /// 16-bit convolutions on a GPU through cuDNN in NHWC, their operands copied in and out
    /// (to measure that layout; off by default)
    #[arg(long, default_value_t = false)]
    conv_nhwc: bool,
    /// When 16-bit channels-last convolutions sum their output per channel in the same cuDNN
    /// kernel for the batch norm after them: `where-faster` (timed per shape, the default),
    /// `always` (wherever cuDNN has an engine), `off`
    #[arg(long, value_enum, default_value_t = ConvStatsFlag::WhereFaster)]
    conv_stats: ConvStatsFlag,
    /// Run the ResNet's blocks on channels-last tensors (the stem converts its input once)
    #[arg(long, default_value_t = false)]
    channels_last: bool,
    /// Leave cudarc's per-allocation event tracking on (to measure what turning it off saves)
    #[arg(long, default_value_t = false)]
    cuda_event_tracking: bool,
    /// Let the memory pool release freed memory at each synchronisation, the driver's default
    #[arg(long, default_value_t = false)]
    cuda_release_memory: bool,
    /// On a GPU, replay the step from a CUDA graph after the warm-up steps (the trainer's
    /// default on one GPU); `false` times the eagerly issued step
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    cuda_graph: bool,
    /// Time the steps as a training loop runs them: each launched before the one before it is
    /// read (`Trainer::launch`; replays queue behind each other, every loss still read), the
    /// step being the loop's wall time over the timed steps (forward and backward not split),
    /// as the `compile-pipelined` anchor times PyTorch's
    #[arg(long, default_value_t = false)]
    launch_ahead: bool,
    /// SGD (momentum 0.9, weight decay 1e-4) or AdamW (lr 1e-3, weight decay 1e-2; PyTorch's
    /// fused AdamW on a GPU)
    #[arg(long, value_enum, default_value_t = OptimizerKind::Sgd)]
    optimizer: OptimizerKind,
    /// ZeRO-Offload on one GPU: the optimizer's master weights and states in host memory, its
    /// step on the CPU (the gradients copied over, the parameters back; no CUDA graph)
    #[arg(long, default_value_t = false)]
    offload_optimizer: bool,
    /// With --offload-optimizer: from this step on, overlap the CPU's update with the next
    /// step's forward and backward (DeepSpeed's delayed parameter update; changes the math)
    #[arg(long, value_name = "STEP")]
    delayed_update_from: Option<u64>,
    /// On a GPU, use at most this much of its memory (e.g. 4GiB; the rest is held by a
    /// blocker allocation): a run against a smaller GPU
    #[arg(long)]
    gpu_memory_cap: Option<String>,
    /// weft's precision policy (fp32, bf16-mixed, fp16-mixed, bf16-true); the anchor autocasts
    /// to the same 16-bit type (fp16 with a GradScaler)
    #[arg(long, default_value = "fp32")]
    precision: String,
    /// PyTorch configurations to time, each in the same call: `eager` (NCHW), `channels-last`,
    /// `compile` (channels-last under `torch.compile(mode="reduce-overhead")`, each phase
    /// synchronised and timed), `compile-pipelined` (the same with the steps back to back and
    /// the fused SGD: a compiled training loop's speed)
    #[arg(long, value_delimiter = ',', default_value = "eager")]
    anchors: Vec<AnchorConfig>,
}

/// A PyTorch configuration of the anchor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AnchorConfig {
    Eager,
    ChannelsLast,
    Compile,
    /// `compile` with the steps back to back (no synchronisation between phases) and the
    /// fused SGD: what a compiled training loop runs at.
    CompilePipelined,
}

impl AnchorConfig {
    fn flags(self) -> &'static [&'static str] {
        match self {
            AnchorConfig::Eager => &[],
            AnchorConfig::ChannelsLast => &["--channels-last"],
            AnchorConfig::Compile => &["--channels-last", "--compile"],
            AnchorConfig::CompilePipelined => &["--channels-last", "--compile", "--pipelined"],
        }
    }

    fn name(self) -> &'static str {
        match self {
            AnchorConfig::Eager => "pytorch",
            AnchorConfig::ChannelsLast => "pt-nhwc",
            AnchorConfig::Compile => "pt-comp",
            AnchorConfig::CompilePipelined => "pt-loop",
        }
    }
}

/// Whose kernels CUDA tensors take for batch norm, ReLU and max-pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CudaKernels {
    Weft,
    Candle,
}

/// Median timings of one framework.
#[derive(Debug)]
struct Measured {
    forward: f64,
    backward: f64,
    step: f64,
    images_per_sec: f64,
    /// Peak bytes in use by tensors on the device (GPU only).
    peak_bytes: Option<u64>,
    /// Bytes in use on the device as it sees it (context and pools included), after the steps.
    device_bytes: Option<u64>,
}

pub fn run(args: &BenchStepArgs) -> Result<()> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!(
        "bench-step: {} batch {} at {}x{}{}, {} timed steps after {} warm-up, {} threads, device {}",
        args.model, args.batch_size, args.image_size, args.image_size,
        if args.cifar_stem { " (CIFAR stem)" } else { "" },
        args.steps, args.warmup, threads, args.device
    );
    let policy = PrecisionPolicy::from_name(&args.precision)?;
    let weft = measure_weft(args, &policy)?;
    print_row("weft", &weft);
    #[cfg(feature = "cudnn")]
    for line in weft_tensor::ops::conv_stats_plans() {
        println!("  conv + sums {line}");
    }
    if args.no_anchor {
        return Ok(());
    }
    let mut fastest: Option<(AnchorConfig, f64)> = None;
    for &config in &args.anchors {
        let torch = measure_torch(args, threads, config, &policy)?;
        print_row(config.name(), &torch);
        println!(
            "ratio weft/{}: step {:.2}x (time), forward {:.2}x, backward {:.2}x; images/s {:.2}x",
            config.name(),
            weft.step / torch.step,
            weft.forward / torch.forward,
            weft.backward / torch.backward,
            weft.images_per_sec / torch.images_per_sec
        );
        if fastest.is_none_or(|(_, best)| torch.images_per_sec > best) {
            fastest = Some((config, torch.images_per_sec));
        }
    }
    if let Some((config, best)) = fastest.filter(|_| args.anchors.len() > 1) {
        println!(
            "weft against PyTorch's fastest configuration ({}): {:.2}x images/s",
            config.name(),
            weft.images_per_sec / best
        );
    }
    Ok(())
}

fn print_row(name: &str, m: &Measured) {
    println!(
        "{name:>8}: step {:8.3} s  forward {:8.3} s  backward {:8.3} s  {:8.1} images/s{}",
        m.step,
        m.forward,
        m.backward,
        m.images_per_sec,
        m.peak_bytes.map_or(String::new(), |b| format!(
            "  peak memory {:.0} MiB",
            b as f64 / (1u64 << 20) as f64
        )) + &m.device_bytes.map_or(String::new(), |b| format!(
            ", device in use {:.0} MiB",
            b as f64 / (1u64 << 20) as f64
        ))
    );
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn measure_weft(args: &BenchStepArgs, policy: &PrecisionPolicy) -> Result<Measured> {
    let device = weft_train::device::parse_device(&args.device)?.open()?;
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        weft_tensor::cuda_runtime::configure(
            &device,
            weft_tensor::cuda_runtime::CudaRuntimeSettings {
                keep_freed_memory: !args.cuda_release_memory,
                event_tracking: args.cuda_event_tracking,
            },
        )?;
        weft_tensor::ops::set_cuda_kernels(args.cuda_kernels == CudaKernels::Weft);
        weft_tensor::ops::set_conv_nhwc(args.conv_nhwc);
        weft_tensor::ops::set_conv_stats(args.conv_stats.into());
    }
    #[cfg(feature = "cuda")]
    let _blocker = match &args.gpu_memory_cap {
        Some(cap) => {
            let cap = weft_cli::memory_plan::parse_bytes("--gpu-memory-cap", cap)?;
            weft_tensor::cuda_runtime::cap_device_memory(&device, cap)?
        }
        None => None,
    };
    #[cfg(not(feature = "cuda"))]
    if args.gpu_memory_cap.is_some() {
        anyhow::bail!("--gpu-memory-cap: this build has no CUDA support");
    }
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        println!(
            "CUDA: {:?} kernels, event tracking {}, freed memory {}, TF32 convolutions {} and matmuls off",
            args.cuda_kernels,
            if args.cuda_event_tracking {
                "on"
            } else {
                "off"
            },
            if args.cuda_release_memory {
                "released"
            } else {
                "kept"
            },
            on_off(cfg!(feature = "cudnn"))
        );
    }
    let mut config = ResNetConfig::from_name(&args.model, args.num_classes)?;
    if args.cifar_stem {
        config = config.with_cifar_stem();
    }
    let config = config.with_channels_last(args.channels_last);
    let model = resnet(&config, policy.param, &device)?;
    // As the trainer does (the step engine assembled by weft-train): the CPU rule over a master
    // copy on the CPU, the CUDA kernels on a GPU. The anchor uses the same hyperparameters.
    let optimizer = match args.optimizer {
        OptimizerKind::Sgd => OptimizerSettings::sgd(0.1, 0.9, 1e-4),
        OptimizerKind::Adamw => OptimizerSettings::adamw(1e-3, AdamWConfig::default().weight_decay),
    };
    let optimizer = OptimizerSettings {
        offload_optimizer: args.offload_optimizer,
        delayed_update_from: args.delayed_update_from,
        ..optimizer
    };
    let step = StepSettings::new(optimizer, *policy);
    let mut trainer =
        step_engine::assemble(model, Box::new(Classification), &step)?.with_synchronized_timings();
    if args.cuda_graph {
        trainer = trainer.with_cuda_graph();
    }
    let shape = (args.batch_size, 3, args.image_size, args.image_size);
    let images = Tensor::randn(0f32, 1.0, shape, &device)?.to_dtype(policy.compute)?;
    // Handed over channels-last where the model runs so, as the PyTorch anchor's batch is.
    let images = match args.channels_last {
        true => weft_tensor::ops::to_channels_last(&images)?,
        false => images,
    };
    let labels = Tensor::from_vec(
        (0..args.batch_size as u32)
            .map(|i| i % args.num_classes as u32)
            .collect::<Vec<_>>(),
        args.batch_size,
        &device,
    )?;
    let mut timings: Vec<StepTimings> = Vec::new();
    let mut walls = Vec::new();
    let mut graphed = 0;
    let synchronized_steps = match args.launch_ahead {
        true => args.warmup,
        false => args.warmup + args.steps,
    };
    for i in 0..synchronized_steps {
        if i == args.warmup {
            reset_peak_memory(&device)?;
            set_profiler_collection(&device, true)?;
        }
        let start = Instant::now();
        let outcome = trainer.step(&images, &labels, 0.1)?;
        device.synchronize()?;
        if i >= args.warmup {
            timings.push(outcome.timings);
            walls.push(start.elapsed().as_secs_f64());
            graphed += usize::from(outcome.graphed);
        }
    }
    if args.launch_ahead {
        reset_peak_memory(&device)?;
        set_profiler_collection(&device, true)?;
        let start = Instant::now();
        let mut in_flight = None;
        for _ in 0..args.steps {
            let launched = trainer.launch(&images, &labels, (1, 0.1))?;
            if let Some(earlier) = in_flight.replace(launched) {
                graphed += usize::from(trainer.finish(earlier)?.graphed);
            }
        }
        if let Some(last) = in_flight {
            graphed += usize::from(trainer.finish(last)?.graphed);
        }
        device.synchronize()?;
        let wall = start.elapsed().as_secs_f64() / args.steps.max(1) as f64;
        timings.push(StepTimings::default());
        walls.push(wall);
    }
    set_profiler_collection(&device, false)?;
    if graphed > 0 {
        println!(
            "{graphed} of {} timed steps replayed from a CUDA graph (no forward/backward split)",
            args.steps
        );
    }
    let secs = |f: fn(&StepTimings) -> Duration| {
        median(timings.iter().map(|t| f(t).as_secs_f64()).collect())
    };
    let step = median(walls);
    Ok(Measured {
        forward: secs(|t| t.forward),
        backward: secs(|t| t.backward),
        step,
        images_per_sec: args.batch_size as f64 / step,
        peak_bytes: peak_memory(&device)?,
        device_bytes: device_memory(&device)?,
    })
}

/// Restarts the device's peak-memory counter (GPU only).
fn reset_peak_memory(device: &candle_core::Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    weft_tensor::cuda_runtime::reset_peak_memory(device)?;
    let _ = device;
    Ok(())
}

/// Turns a profiler attached with its collection off at start on or off (GPU only): a
/// profile of bench-step then holds only the timed steps.
fn set_profiler_collection(device: &candle_core::Device, on: bool) -> Result<()> {
    #[cfg(feature = "cuda")]
    weft_tensor::cuda_runtime::set_profiler_collection(device, on)?;
    let _ = (device, on);
    Ok(())
}

/// Peak bytes used by tensors since the last reset (GPU only).
fn peak_memory(device: &candle_core::Device) -> Result<Option<u64>> {
    #[cfg(feature = "cuda")]
    return Ok(weft_tensor::cuda_runtime::memory_usage(device)?.map(|u| u.used_peak));
    #[cfg(not(feature = "cuda"))]
    {
        let _ = device;
        Ok(None)
    }
}

/// Bytes in use on the device as it sees it (GPU only).
fn device_memory(device: &candle_core::Device) -> Result<Option<u64>> {
    #[cfg(feature = "cuda")]
    return Ok(weft_tensor::cuda_runtime::device_memory_in_use(device)?);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = device;
        Ok(None)
    }
}

fn measure_torch(
    args: &BenchStepArgs,
    threads: usize,
    config: AnchorConfig,
    policy: &PrecisionPolicy,
) -> Result<Measured> {
    let python = python::torch_python()?;
    let mut cmd = Command::new(python);
    cmd.arg(python::script("bench_step.py"))
        .args(["--model", &args.model])
        .args(["--batch-size", &args.batch_size.to_string()])
        .args(["--image-size", &args.image_size.to_string()])
        .args(["--num-classes", &args.num_classes.to_string()])
        .args(["--steps", &args.steps.to_string()])
        .args(["--warmup", &args.warmup.to_string()])
        .args(["--threads", &threads.to_string()])
        .args(["--device", &args.device])
        .args([
            "--optimizer",
            match args.optimizer {
                OptimizerKind::Sgd => "sgd",
                OptimizerKind::Adamw => "adamw",
            },
        ]);
    if args.cifar_stem {
        cmd.arg("--cifar-stem");
    }
    let amp = match policy.compute {
        DType::BF16 => "bf16",
        DType::F16 => "fp16",
        _ => "none",
    };
    cmd.args(["--amp", amp]).args(config.flags());
    let output = cmd.output().context("cannot run the PyTorch anchor")?;
    if !output.status.success() {
        bail!(
            "PyTorch anchor failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let line = String::from_utf8_lossy(&output.stdout);
    let json: serde_json::Value = serde_json::from_str(line.trim().lines().last().unwrap_or(""))
        .with_context(|| format!("PyTorch anchor printed no JSON: {line}"))?;
    println!(
        "anchor {}: torch {} with {} threads, autocast {}, channels-last {}, compile {}, pipelined {}{}",
        config.name(),
        json["torch"],
        json["threads"],
        json["amp"],
        json["channels_last"],
        json["compile"],
        json["pipelined"],
        match (
            json["tf32_convolutions"].as_bool(),
            json["tf32_matmul"].as_bool()
        ) {
            (Some(conv), Some(matmul)) => format!(
                ", TF32 convolutions {} and matmuls {} (PyTorch's defaults)",
                on_off(conv),
                on_off(matmul)
            ),
            _ => String::new(),
        }
    );
    let get = |key: &str| {
        json[key]
            .as_f64()
            .with_context(|| format!("anchor output lacks {key}"))
    };
    let step = get("step_s")?;
    Ok(Measured {
        forward: get("forward_s")?,
        backward: get("backward_s")?,
        step,
        images_per_sec: args.batch_size as f64 / step,
        peak_bytes: json["peak_bytes"].as_u64(),
        device_bytes: json["device_bytes"].as_u64(),
    })
}
