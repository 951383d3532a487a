//! `train-resnet` and `train-gpt`: one rank in this process, or, with `--nproc N` outside a
//! launched job, N ranks started through the launcher, all naming the same run folder.

use std::process::ExitCode;

use anyhow::Result;
use weft_train::distributed::launched;
use weft_train::run_dir::default_run_name;

use crate::{ranks, WithoutCuda};

/// Trains a ResNet.
pub fn resnet(args: weft_train::TrainArgs, without_cuda: WithoutCuda) -> Result<ExitCode> {
    args.validate()?;
    let name =
        (args.log.name.is_none()).then(|| default_run_name(&args.model.model, &args.data.data));
    launch_or_run(
        &args.training.device,
        args.ranks(),
        name,
        without_cuda,
        || weft_train::resnet::run(&args).map(|_| ()),
    )
}

/// Trains a GPT.
pub fn gpt(args: weft_train::GptArgs, without_cuda: WithoutCuda) -> Result<ExitCode> {
    args.validate()?;
    let name = (args.log.name.is_none())
        .then(|| default_run_name(&args.model.model_name(), &args.data.data));
    launch_or_run(
        &args.training.device,
        args.ranks(),
        name,
        without_cuda,
        || weft_train::gpt::run(&args).map(|_| ()),
    )
}

/// Answers a GPU device on a CPU-only build with `without_cuda`; starts `ranks` processes
/// outside a launched job (each given `--name default_name` when the flags name no run);
/// runs `train` otherwise.
fn launch_or_run(
    device: &str,
    ranks: usize,
    default_name: Option<String>,
    without_cuda: WithoutCuda,
    train: impl FnOnce() -> Result<()>,
) -> Result<ExitCode> {
    if device.starts_with("cuda") && !cfg!(feature = "cuda") {
        return without_cuda(device);
    }
    if ranks > 1 && !launched(|var| std::env::var(var).ok()) {
        let mut rank_args: Vec<String> = std::env::args().skip(1).collect();
        if let Some(name) = default_name {
            rank_args.extend(["--name".into(), name]);
        }
        return ranks::run(ranks, &rank_args);
    }
    train().map(|()| ExitCode::SUCCESS)
}
