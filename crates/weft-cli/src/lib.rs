//! The `weft` command's subcommands, shared with `cargo xtask` (which adds the benchmarks and
//! the GPU checks): `train-resnet` and `train-gpt` (weft-train's trainers behind one loop),
//! `report` (a run folder drawn), `memory-plan` (a run's memory before any GPU is touched) and
//! `tokenize` (text to pre-tokenized shards).
//! A trainer asked for several ranks outside a launched job starts them itself through
//! weft-launch's launcher ([`ranks`]); inside one (`weft run`, torchrun, `srun`) it is one rank.

pub mod memory_plan;
pub mod ranks;
pub mod report;
pub mod tokenize;
mod train;

use std::ffi::OsString;
use std::process::ExitCode;

use anyhow::Result;
use clap::Subcommand;

/// The subcommands `weft` and `cargo xtask` share.
#[derive(Subcommand)]
pub enum Command {
    /// Train a ResNet (default: on the CPU, on the embedded synthetic data set, in a few minutes)
    TrainResnet(weft_train::TrainArgs),
    /// Train a GPT (default: gpt-tiny on the CPU, on a synthetic token task, in a few minutes)
    TrainGpt(weft_train::GptArgs),
    /// Draw a run folder: loss, accuracy, throughput, one step's timeline per rank, memory by
    /// category (SVG and PNG), and a summary table
    Report(report::ReportArgs),
    /// Predict a training run's memory per rank, by category with formulas, before any GPU
    /// is touched
    MemoryPlan(memory_plan::MemoryPlanArgs),
    /// Tokenize text files into pre-tokenized shards (llm.c's format) for
    /// `train-gpt --data tokens:PATTERN`
    Tokenize(tokenize::TokenizeArgs),
}

/// What a trainer does when `--device` names a GPU and this binary was built without CUDA:
/// `weft` stops with one line saying how to install the GPU build; `cargo xtask` rebuilds
/// itself with CUDA and runs the same command.
pub type WithoutCuda = fn(device: &str) -> Result<ExitCode>;

/// Runs `command`; `without_cuda` answers a GPU device on a CPU-only build.
pub fn run(command: Command, without_cuda: WithoutCuda) -> Result<ExitCode> {
    match command {
        Command::TrainResnet(args) => train::resnet(args, without_cuda),
        Command::TrainGpt(args) => train::gpt(args, without_cuda),
        Command::Report(args) => report::run(&args).map(|_| ExitCode::SUCCESS),
        Command::MemoryPlan(args) => memory_plan::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Tokenize(args) => tokenize::run(&args).map(|()| ExitCode::SUCCESS),
    }
}

/// The process's arguments with a trainer's `--config FILE` read into flags (the flags given
/// win), for the command `cli` describes; the error names the file and the key.
pub fn args_with_config(cli: &clap::Command) -> Result<Vec<OsString>> {
    weft_train::config_file::expand(cli, std::env::args_os().collect())
}

/// Keeps freed large buffers in the heap instead of returning them to the kernel: a training
/// step allocates and frees the same activation sizes every step, and fresh pages from mmap
/// cost up to a quarter of the CPU time of some kernels (glibc only). Call it first in `main`.
pub fn keep_freed_memory() {
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
