//! Running a command on N ranks: builds the `weft-run` launcher and starts this very binary
//! once per rank under it, with one CPU thread pool share per rank.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::python::workspace_root;

/// Path of the weft-launch binary `name`: the one next to this xtask binary when it
/// was shipped alongside (a bundle carried to a machine without cargo), otherwise built in
/// release mode with cargo (with the NCCL backend when this binary has it), in the same target
/// folder as this binary.
pub fn collectives_binary(name: &str) -> Result<PathBuf> {
    let me = std::env::current_exe().context("cannot find the xtask binary")?;
    let beside = me.with_file_name(name);
    if std::env::var_os("CARGO").is_none() && beside.exists() {
        return Ok(beside);
    }
    // With this binary's NCCL backend, so that `--device cuda` ranks can use it.
    let features: &[&str] = if cfg!(feature = "nccl") {
        &["--features", "nccl"]
    } else {
        &[]
    };
    let status = Command::new(env!("CARGO"))
        .args(["build", "--release", "--quiet", "-p", "weft-launch"])
        .args(["--bin", name])
        .args(features)
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("cannot run cargo to build {name}"))?;
    if !status.success() {
        bail!("building {name} failed ({status})");
    }
    Ok(target_dir().join("release").join(name))
}

/// The `weft-run` launcher.
pub fn build_launcher() -> Result<PathBuf> {
    collectives_binary("weft-run")
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Runs `xtask ARGS…` on `nproc` ranks through `weft-run`; fails if any rank fails.
pub fn run_ranks(nproc: usize, args: &[String]) -> Result<()> {
    let launcher = build_launcher()?;
    let me = std::env::current_exe().context("cannot find the xtask binary")?;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let threads =
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| (cores / nproc).max(1).to_string());
    let status = Command::new(&launcher)
        .args(["--nproc-per-node", &nproc.to_string(), "--"])
        .arg(me)
        .args(args)
        .env("RAYON_NUM_THREADS", threads)
        .status()
        .with_context(|| format!("cannot start {}", launcher.display()))?;
    if !status.success() {
        bail!("the {nproc}-rank job failed ({status})");
    }
    Ok(())
}
