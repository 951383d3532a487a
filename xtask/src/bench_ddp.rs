//! `cargo xtask bench-ddp`: data-parallel scaling on this machine. Trains the same model on
//! synthetic data with 1 rank (one thread, and all threads) and with N ranks (one thread pool
//! share each) at the same batch per rank, and reports images/s, the share of communication hidden under backward and
//! the scaling efficiency `img/s(N) / (N × img/s(1 rank, same threads per rank))`.

use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::python::workspace_root;

mod anchor;

#[derive(Debug, Args)]
pub struct BenchDdpArgs {
    #[arg(long, default_value = "resnet20")]
    model: String,
    /// Batch size per rank (the N-rank run trains on N times as many images per step)
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    #[arg(long, default_value_t = 32)]
    image_size: usize,
    /// Steps per run; the first `warmup` are not counted
    #[arg(long, default_value_t = 12)]
    steps: usize,
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Ranks of the data-parallel run
    #[arg(long, default_value_t = 2)]
    nproc: usize,
    /// cpu (ranks share this machine's cores) or cuda (one GPU per rank, NCCL)
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Classes of the synthetic data set (the GPU anchor uses 1000)
    #[arg(long)]
    num_classes: Option<usize>,
    /// SGD learning rate, momentum and weight decay (the reference configuration's defaults)
    #[arg(long, default_value_t = 0.1)]
    lr: f64,
    #[arg(long, default_value_t = 0.9)]
    momentum: f64,
    #[arg(long, default_value_t = 1e-4)]
    weight_decay: f64,
    /// GPU counts of the data-parallel runs, each set against 1 GPU (GPU only; default --nproc;
    /// 1 alone: the one-GPU run only, e.g. for its memory beside PyTorch's)
    #[arg(long, value_delimiter = ',')]
    world_sizes: Vec<usize>,
    /// Skip the PyTorch DDP anchor (GPU only)
    #[arg(long, default_value_t = false)]
    no_anchor: bool,
    /// PyTorch DDP's configurations run beside weft's (GPU only): eager (the SGD's foreach
    /// kernels) and compile (`torch.compile` over the DDP model, the fused SGD)
    #[arg(long, value_delimiter = ',', default_value = "eager")]
    anchors: Vec<anchor::Variant>,
    /// Let every run replay its step from a CUDA graph (the trainer's default); off, every run
    /// issues its step eagerly, so that the scaling compares the same execution
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    cuda_graph: bool,
    /// ZeRO stages of the N-rank run on the CPU, each a run of its own against the same
    /// one-rank runs (0: plain DDP)
    #[arg(long, value_delimiter = ',', default_value = "0")]
    zero: Vec<u8>,
    /// Optimizer of every run: sgd or adamw
    #[arg(long, default_value = "sgd")]
    optimizer: String,
    /// Data loader threads per rank (default: train-resnet's — 1 on the CPU; on GPUs the
    /// host's cores shared out, at most 8, so that no rank waits for its images and stalls
    /// the others)
    #[arg(long)]
    workers: Option<usize>,
    /// weft's precision policy for every run (fp32, bf16-mixed, fp16-mixed); the GPU anchor
    /// autocasts to the same 16-bit type (fp16 with a GradScaler)
    #[arg(long, default_value = "fp32")]
    precision: String,
    /// DDP gradient compression (none, bf16, fp16); the GPU anchor registers PyTorch's
    /// `bf16_compress_hook` / `fp16_compress_hook`
    #[arg(long, default_value = "none")]
    grad_compression: String,
    /// SyncBatchNorm in both (weft's `--sync-bn`, PyTorch's `convert_sync_batchnorm`): the
    /// batch statistics over every rank's batch
    #[arg(long, default_value_t = false)]
    sync_bn: bool,
    /// weft's last DDP bucket in MiB (train-resnet's flag; 0: PyTorch's plan, the anchor's)
    #[arg(long, default_value_t = 0.0)]
    last_bucket_cap_mb: f64,
    /// weft's DDP makes every rank read rank 0's buffers (train-resnet's flag)
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    broadcast_buffers: bool,
    /// weft's optimizer steps the other buckets while the last one is reduced (train-resnet's
    /// flag)
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    step_during_last_bucket: bool,
    /// Channels-last tensors in weft's runs and in the GPU anchor
    #[arg(long, default_value_t = false)]
    channels_last: bool,
    /// weft's runs launch each replayed step before reading the one before (train-resnet's
    /// flag)
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    launch_ahead: bool,
}

struct Measured {
    images_per_sec: f64,
    comm_hidden: Option<f64>,
}

pub fn run(args: &BenchDdpArgs) -> Result<()> {
    if args.device.starts_with("cuda") {
        if args.zero != [0] {
            bail!("--zero: the GPU comparison runs plain DDP only so far (ZeRO on GPUs goes with the multi-GPU runs)");
        }
        return run_gpu(args);
    }
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let per_rank_threads = (cores / args.nproc).max(1);
    println!(
        "bench-ddp: {} batch {} per rank at {}x{}, {} steps ({} warm-up), {cores} cores",
        args.model, args.batch_size, args.image_size, args.image_size, args.steps, args.warmup
    );
    let single_narrow = measure(args, (1, 0), per_rank_threads, "1rank-narrow")?;
    let single_wide = measure(args, (1, 0), cores, "1rank-wide")?;
    let row = |label: String, m: &Measured| {
        let hidden = m
            .comm_hidden
            .map(|h| format!("{:.0}%", 100.0 * h))
            .unwrap_or_else(|| "-".into());
        println!(
            "{label:<34} {:>10.1} img/s   comm hidden {hidden}",
            m.images_per_sec
        );
    };
    row(
        format!("1 rank x {per_rank_threads} thread(s)"),
        &single_narrow,
    );
    row(format!("1 rank x {cores} thread(s)"), &single_wide);
    for &zero in &args.zero {
        let tag = format!("nrank-zero{zero}");
        let multi = measure(args, (args.nproc, zero), per_rank_threads, &tag)?;
        let strategy = match zero {
            0 => "DDP".to_string(),
            stage => format!("ZeRO-{stage}"),
        };
        row(
            format!(
                "{} ranks x {per_rank_threads} thread(s), {strategy}",
                args.nproc
            ),
            &multi,
        );
        println!(
            "scaling efficiency ({strategy}) {} ranks vs 1 rank of the same threads: {:.1}%; throughput vs 1 rank on all cores: {:.2}x",
            args.nproc,
            100.0 * multi.images_per_sec / (args.nproc as f64 * single_narrow.images_per_sec),
            multi.images_per_sec / single_wide.images_per_sec
        );
    }
    Ok(())
}

/// One GPU against each of `--world-sizes` GPUs (default `--nproc`) at the same batch per
/// GPU, and PyTorch's `DistributedDataParallel` on the same GPUs as the anchor.
fn run_gpu(args: &BenchDdpArgs) -> Result<()> {
    let worlds = if args.world_sizes.is_empty() {
        vec![args.nproc]
    } else {
        args.world_sizes.clone()
    };
    println!(
        "bench-ddp: {} on {}, batch {} per GPU at {}x{}, {} steps ({} warm-up)",
        args.model,
        args.device,
        args.batch_size,
        args.image_size,
        args.image_size,
        args.steps,
        args.warmup
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut weft = Vec::new();
    for &world in std::iter::once(&1).chain(worlds.iter().filter(|&&w| w != 1)) {
        let tag = format!("{world}gpu");
        announce_phase(&format!("weft-{tag}"));
        weft.push((
            world,
            measure(args, (world, 0), (cores / world).max(1), &tag)?,
        ));
    }
    let single = weft[0].1.images_per_sec;
    for (world, m) in &weft {
        println!(
            "weft   {world} GPU(s) {:>9.1} img/s   comm hidden {}   scaling efficiency {:.1}%",
            m.images_per_sec,
            m.comm_hidden
                .map_or("-".into(), |h| format!("{:.0}%", 100.0 * h)),
            100.0 * m.images_per_sec / (*world as f64 * single)
        );
    }
    if args.no_anchor {
        return Ok(());
    }
    let worlds: Vec<usize> = weft.iter().map(|(w, _)| *w).collect();
    for &variant in &args.anchors {
        announce_phase(variant.phase());
        let rates = anchor::run(args, variant, &worlds)?;
        for (world, m) in &weft {
            let rate = rates.images_per_sec(*world);
            println!(
                "{:<14} {world} GPU(s) {rate:>9.1} img/s   scaling efficiency {:.1}%   weft/torch {:.3}",
                variant.phase(),
                100.0 * rate / (*world as f64 * rates.images_per_sec(1)),
                m.images_per_sec / rate
            );
        }
    }
    Ok(())
}

/// Prints `phase NAME at UNIX-SECONDS`, so that a memory sampler running beside the benchmark
/// (xtask/gpu/run-distributed.sh) can attribute its samples.
fn announce_phase(name: &str) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    println!("phase {name} at {now:.3}");
}

/// One training run of `nproc` ranks under ZeRO stage `zero`.
fn measure(
    args: &BenchDdpArgs,
    (nproc, zero): (usize, u8),
    threads: usize,
    tag: &str,
) -> Result<Measured> {
    let global_batch = args.batch_size * nproc;
    let out = workspace_root().join("target/bench-runs");
    let name = format!("bench-ddp-{tag}-{}", std::process::id());
    let me = std::env::current_exe()?;
    let mut command = Command::new(me);
    command.args(["train-resnet", "--quiet", "--model", &args.model]);
    if let Some(classes) = args.num_classes {
        command.args(["--num-classes", &classes.to_string()]);
    }
    let status = command
        .args(["--device", &args.device])
        .args(["--optimizer", &args.optimizer, "--lr", &args.lr.to_string()])
        .args(["--zero", &zero.to_string()])
        .args(["--momentum", &args.momentum.to_string()])
        .args(["--weight-decay", &args.weight_decay.to_string()])
        .args(["--batch-size", &global_batch.to_string()])
        .args(["--image-size", &args.image_size.to_string()])
        .args(["--steps", &args.steps.to_string()])
        .args(["--nproc", &nproc.to_string()])
        .args(["--synthetic-val", &global_batch.to_string()])
        // One epoch holds every step: an epoch's end (validation, the loader's restart) inside
        // the timed steps took 4 GPUs' bf16 batch-128 rate from 97.6 % to 86.6 % of linear.
        .args([
            "--synthetic-train",
            &(global_batch * args.steps).max(8192).to_string(),
        ])
        .args(["--cuda-graph", &args.cuda_graph.to_string()])
        .args(["--launch-ahead", &args.launch_ahead.to_string()])
        .args(
            args.workers
                .iter()
                .flat_map(|w| ["--workers".into(), w.to_string()]),
        )
        .args(["--precision", &args.precision])
        .args(["--grad-compression", &args.grad_compression])
        .args(["--last-bucket-cap-mb", &args.last_bucket_cap_mb.to_string()])
        .args(["--broadcast-buffers", &args.broadcast_buffers.to_string()])
        .args([
            "--step-during-last-bucket",
            &args.step_during_last_bucket.to_string(),
        ])
        .args(args.sync_bn.then_some("--sync-bn"))
        // Explicit either way: the trainer's own default (`auto`) differs from PyTorch's.
        .args([
            "--channels-last",
            if args.channels_last { "true" } else { "false" },
        ])
        .arg("--out")
        .arg(&out)
        .args(["--name", &name])
        .env("RAYON_NUM_THREADS", threads.to_string())
        .status()
        .context("cannot start the training run")?;
    if !status.success() {
        bail!("training run {name} failed ({status})");
    }
    let text = std::fs::read_to_string(out.join(&name).join("metrics.jsonl"))?;
    let steps: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("step").is_some())
        .skip(args.warmup)
        .collect();
    if steps.is_empty() {
        bail!("run {name} logged no step after the warm-up");
    }
    let mean = |key: &str| -> Option<f64> {
        let values: Vec<f64> = steps.iter().filter_map(|v| v[key].as_f64()).collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    };
    // Throughput from the mean step time, not the mean of per-step rates.
    let mean_seconds = steps
        .iter()
        .map(|v| args.batch_size as f64 / v["images_per_sec"].as_f64().unwrap_or(f64::NAN))
        .sum::<f64>()
        / steps.len() as f64;
    Ok(Measured {
        images_per_sec: args.batch_size as f64 / mean_seconds,
        comm_hidden: mean("comm_hidden"),
    })
}
