//! weft-launch's binaries for the benchmarks and GPU checks that start them: shipped beside
//! xtask in a bundle, or built by cargo.

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
