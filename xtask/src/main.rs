//! `cargo xtask …`: the project's commands — the ResNet and GPT trainers and the benchmarks.

mod bench_collectives;
mod bench_ddp;
mod bench_gpt;
mod bench_optimizer;
mod bench_pipeline;
mod bench_step;
mod cuda_build;
mod fuzz;
mod gpu_bundle;
mod gpu_check;
mod launch;
mod memory_plan;
mod python;
mod report;

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "weft project commands")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a ResNet (default: on the CPU, on the embedded synthetic data set, in a few minutes)
    TrainResnet(weft_train::TrainArgs),
    /// Train a GPT (default: gpt-tiny on the CPU, on a synthetic token task, in a few minutes)
    TrainGpt(weft_train::GptArgs),
    /// Time forward + backward + SGD step of a ResNet, beside PyTorch on the same machine
    BenchStep(bench_step::BenchStepArgs),
    /// Tokens per second, MFU and peak memory of GPT training steps, beside PyTorch's
    BenchGpt(bench_gpt::BenchGptArgs),
    /// Time the optimizer step alone over a model's parameters, beside PyTorch's fastest
    /// optimizer and the device's copy bandwidth
    BenchOptimizer(bench_optimizer::BenchOptimizerArgs),
    /// Data-parallel scaling on this machine: 1 rank vs N ranks
    BenchDdp(bench_ddp::BenchDdpArgs),
    /// Collective bandwidth and latency (nccl-tests style), beside PyTorch gloo
    BenchCollectives(bench_collectives::BenchCollectivesArgs),
    /// Pipeline parallelism on the CPU: measured bubble per stage against (P-1)/(M+P-1), and
    /// the activation memory GPipe and 1F1B hold
    BenchPipeline(bench_pipeline::BenchPipelineArgs),
    /// Predict a training run's memory per rank, by category with formulas, before any GPU
    /// is touched
    MemoryPlan(memory_plan::MemoryPlanArgs),
    /// Run each fuzz target (cargo-fuzz on nightly: CIFAR reader, safetensors and checkpoint
    /// manifest loading, store protocol and server) for a bounded time
    Fuzz(fuzz::FuzzArgs),
    /// Draw a run folder: loss, accuracy, throughput, one step's timeline per rank, memory by
    /// category (SVG and PNG), and a summary table
    Report(report::ReportArgs),
    /// The CUDA path against the CPU reference, as a pass/fail table (needs a GPU)
    GpuCheck,
    /// Build the CUDA binaries and write a folder that runs on a GPU machine without Rust
    GpuBundle(gpu_bundle::GpuBundleArgs),
    /// One rank of gpu-check's two-GPU data-parallel rows (started by gpu-check)
    #[command(hide = true)]
    GpuCheckDdp,
}

/// Keeps freed large buffers in the heap instead of returning them to the kernel: a training
/// step allocates and frees the same activation sizes every step, and fresh pages from mmap
/// cost up to a quarter of the CPU time of some kernels (glibc only).
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator thresholds; called before any other thread exists.
    unsafe {
        // 32 MiB is the largest mmap threshold glibc accepts; one arena keeps rayon workers'
        // frees reusable by every thread.
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

fn main() {
    keep_freed_memory();
    let argv = weft_train::config_file::expand(&Cli::command(), std::env::args_os().collect());
    let cli = match argv {
        Ok(argv) => Cli::parse_from(argv),
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::exit(2);
        }
    };
    let result: Result<()> = match cli.command {
        Command::TrainResnet(args) => train_resnet(args),
        Command::TrainGpt(args) => train_gpt(args),
        Command::BenchStep(args) => match cuda_build::needs_cuda_build(&args.device) {
            true => cuda_build::rerun_with_cuda(),
            false => bench_step::run(&args),
        },
        Command::BenchGpt(args) => match cuda_build::needs_cuda_build(&args.device) {
            true => cuda_build::rerun_with_cuda(),
            false => bench_gpt::run(&args),
        },
        Command::BenchOptimizer(args) => match cuda_build::needs_cuda_build(&args.device) {
            true => cuda_build::rerun_with_cuda(),
            false => bench_optimizer::run(&args),
        },
        Command::BenchDdp(args) => match cuda_build::needs_cuda_build(&args.device) {
            true => cuda_build::rerun_with_cuda(),
            false => bench_ddp::run(&args),
        },
        Command::BenchCollectives(args) => {
            match args.backend == "nccl" && !cfg!(feature = "nccl") {
                true => cuda_build::rerun_with_cuda(),
                false => bench_collectives::run(&args),
            }
        }
        Command::BenchPipeline(args) => bench_pipeline::run(&args),
        Command::GpuCheck => match cuda_build::needs_cuda_build("cuda") {
            true => cuda_build::rerun_with_cuda(),
            false => gpu_check::run(),
        },
        Command::GpuBundle(args) => gpu_bundle::run(&args),
        Command::GpuCheckDdp => gpu_check::ddp::run_rank(),
        Command::MemoryPlan(args) => memory_plan::run(&args),
        Command::Fuzz(args) => fuzz::run(&args),
        Command::Report(args) => report::run(&args).map(|_| ()),
    };
    if let Err(err) = result {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}

/// Trains in this process, or, with `--nproc N` outside a launched job, starts N ranks.
fn train_resnet(args: weft_train::TrainArgs) -> Result<()> {
    args.validate()?;
    let name = args
        .log
        .name
        .is_none()
        .then(|| weft_train::run_dir::default_run_name(&args.model.model, &args.data.data));
    launch_or_run(&args.training.device, args.ranks(), name, || {
        weft_train::resnet::run(&args).map(|_| ())
    })
}

/// Trains in this process, or, with `--nproc N` outside a launched job, starts N ranks.
fn train_gpt(args: weft_train::GptArgs) -> Result<()> {
    args.validate()?;
    let name = args
        .log
        .name
        .is_none()
        .then(|| weft_train::run_dir::default_run_name(&args.model.model, &args.data.data));
    launch_or_run(&args.training.device, args.ranks(), name, || {
        weft_train::gpt::run(&args).map(|_| ())
    })
}

/// Re-runs with CUDA for a GPU device on a CPU-only build; starts `ranks` processes (all given
/// `--name default_name` when the flags name no run) outside a launched job; runs `train`
/// otherwise.
fn launch_or_run(
    device: &str,
    ranks: usize,
    default_name: Option<String>,
    train: impl FnOnce() -> Result<()>,
) -> Result<()> {
    if cuda_build::needs_cuda_build(device) {
        return cuda_build::rerun_with_cuda();
    }
    let launched = std::env::var_os("WORLD_SIZE").is_some();
    if ranks > 1 && !launched {
        let mut rank_args: Vec<String> = std::env::args().skip(1).collect();
        if let Some(name) = default_name {
            rank_args.extend(["--name".into(), name]);
        }
        return launch::run_ranks(ranks, &rank_args);
    }
    train()
}
