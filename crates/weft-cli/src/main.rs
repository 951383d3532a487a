//! `weft`: train a ResNet or a GPT on CPUs or GPUs, on one rank or many, draw a run, plan a
//! run's memory, and launch ranks (`weft run`, torchrun's role).

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "weft", version, about = "Distributed training in Rust")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
// Parsed once per process: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
enum Command {
    #[command(flatten)]
    Shared(weft_cli::Command),
    /// Start the ranks of a job on this machine: `weft run --nproc-per-node N -- PROGRAM
    /// ARGS…` (torchrun's role: the rendezvous store, one process per rank, the whole job
    /// stopped and the rank named when one fails)
    Run(weft_launch::runner::Args),
}

/// The GPU on a CPU-only `weft`: one line saying how to install the GPU build.
fn without_cuda(device: &str) -> anyhow::Result<ExitCode> {
    anyhow::bail!(
        "--device {device}: this weft was built without CUDA; install the GPU build with \
         `cargo install --locked --path crates/weft-cli --features cuda,cudnn,nccl`"
    )
}

fn main() -> ExitCode {
    weft_cli::keep_freed_memory();
    let cli = match weft_cli::args_with_config(&Cli::command()) {
        Ok(argv) => Cli::parse_from(argv),
        Err(err) => {
            eprintln!("error: {err:#}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Shared(command) => weft_cli::run(command, without_cuda),
        Command::Run(args) => Ok(weft_launch::runner::launch(args)),
    };
    result.unwrap_or_else(|err| {
        eprintln!("error: {err:#}");
        ExitCode::FAILURE
    })
}
