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
mod python;

use std::process::ExitCode;

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "weft project commands")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
// Parsed once per process: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// `weft`'s commands: train-resnet, train-gpt, report, memory-plan
    #[command(flatten)]
    Weft(weft_cli::Command),
    /// The project's own: benchmarks, GPU checks and bundles, fuzzing
    #[command(flatten)]
    Project(ProjectCommand),
}

#[derive(Subcommand)]
enum ProjectCommand {
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
    /// Run each fuzz target (cargo-fuzz on nightly: CIFAR reader, safetensors and checkpoint
    /// manifest loading, store protocol and server) for a bounded time
    Fuzz(fuzz::FuzzArgs),
    /// The CUDA path against the CPU reference, as a pass/fail table (needs a GPU)
    GpuCheck(gpu_check::GpuCheckArgs),
    /// Build the CUDA binaries and write a folder that runs on a GPU machine without Rust
    GpuBundle(gpu_bundle::GpuBundleArgs),
    /// One rank of gpu-check's two-GPU data-parallel rows (started by gpu-check)
    #[command(hide = true)]
    GpuCheckDdp,
}

fn main() -> ExitCode {
    weft_cli::keep_freed_memory();
    let cli = match weft_cli::args_with_config(&Cli::command()) {
        Ok(argv) => Cli::parse_from(argv),
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::exit(2);
        }
    };
    let result = match cli.command {
        Command::Weft(command) => weft_cli::run(command, rerun_with_cuda),
        Command::Project(command) => project(command).map(|()| ExitCode::SUCCESS),
    };
    result.unwrap_or_else(|err| {
        eprintln!("error: {err:#}");
        ExitCode::FAILURE
    })
}

fn project(command: ProjectCommand) -> Result<()> {
    match command {
        ProjectCommand::BenchStep(args) => match cuda_build::needs_cuda_build(&args.device) {
            true => cuda_build::rerun_with_cuda(),
            false => bench_step::run(&args),
        },
        ProjectCommand::BenchGpt(args) => match cuda_build::needs_cuda_build(&args.device) {
            true => cuda_build::rerun_with_cuda(),
            false => bench_gpt::run(&args),
        },
        ProjectCommand::BenchOptimizer(args) => match cuda_build::needs_cuda_build(&args.device) {
            true => cuda_build::rerun_with_cuda(),
            false => bench_optimizer::run(&args),
        },
        ProjectCommand::BenchDdp(args) => match cuda_build::needs_cuda_build(&args.device) {
            true => cuda_build::rerun_with_cuda(),
            false => bench_ddp::run(&args),
        },
        ProjectCommand::BenchCollectives(args) => {
            match args.backend == "nccl" && !cfg!(feature = "nccl") {
                true => cuda_build::rerun_with_cuda(),
                false => bench_collectives::run(&args),
            }
        }
        ProjectCommand::BenchPipeline(args) => bench_pipeline::run(&args),
        ProjectCommand::GpuCheck(args) => match cuda_build::needs_cuda_build("cuda") {
            true => cuda_build::rerun_with_cuda(),
            false => gpu_check::run(&args),
        },
        ProjectCommand::GpuBundle(args) => gpu_bundle::run(&args),
        ProjectCommand::GpuCheckDdp => gpu_check::ddp::run_rank(),
        ProjectCommand::Fuzz(args) => fuzz::run(&args),
    }
}

/// A trainer's GPU device on this CPU-only build: rebuilt with CUDA, the same command run.
fn rerun_with_cuda(_device: &str) -> Result<ExitCode> {
    cuda_build::rerun_with_cuda().map(|()| ExitCode::SUCCESS)
}
