//! `cargo xtask …`: the project's commands — the ResNet trainer and the benchmarks.

mod bench_step;
mod python;

use anyhow::Result;
use clap::{Parser, Subcommand};

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
    /// Time forward + backward + SGD step of a ResNet, beside PyTorch on the same machine
    BenchStep(bench_step::BenchStepArgs),
}

fn main() {
    let cli = Cli::parse();
    let result: Result<()> = match cli.command {
        Command::TrainResnet(args) => weft_train::resnet::run(&args).map(|_| ()),
        Command::BenchStep(args) => bench_step::run(&args),
    };
    if let Err(err) = result {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}
