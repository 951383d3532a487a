//! `--device cuda` from a CPU-only build of xtask: rebuilds xtask with the `cuda` feature (in
//! its own target folder, so CPU builds stay valid) and runs the same command with it, or stops
//! with one line saying what is missing.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::python::workspace_root;

/// Whether `device` (a `--device` value) names a GPU this binary cannot drive.
pub fn needs_cuda_build(device: &str) -> bool {
    device.starts_with("cuda") && !cfg!(feature = "cuda")
}

pub fn find_nvcc() -> Option<PathBuf> {
    let from_home = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .map(|home| PathBuf::from(home).join("bin/nvcc"));
    let from_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("nvcc"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    from_home.chain(from_path).find(|p| p.is_file())
}

/// Whether the NVIDIA driver's `libcuda.so.1` can be loaded (ldconfig's cache or LD_LIBRARY_PATH).
fn has_driver() -> bool {
    let in_cache = Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so.1"))
        .unwrap_or(false);
    let in_path = std::env::var_os("LD_LIBRARY_PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("libcuda.so.1").exists()))
        .unwrap_or(false);
    in_cache || in_path
}

/// Re-runs this command through `cargo run --features cuda` and exits with its status.
pub fn rerun_with_cuda() -> Result<()> {
    if find_nvcc().is_none() {
        bail!("--device cuda: no CUDA toolkit found (nvcc is neither on PATH nor in CUDA_HOME/bin); see README, Running on GPUs");
    }
    if !has_driver() {
        bail!("--device cuda: no NVIDIA driver found (libcuda.so.1 is not in the loader's cache or LD_LIBRARY_PATH)");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/gpu"));
    eprintln!(
        "xtask: building with --features cuda,nccl,cudnn in {} (the first CUDA build takes a while)",
        target.display()
    );
    let status = Command::new(env!("CARGO"))
        .args([
            "run",
            "--release",
            "--quiet",
            "-p",
            "xtask",
            "--features",
            "cuda,nccl,cudnn",
            "--",
        ])
        .args(std::env::args().skip(1))
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(workspace_root())
        .status()
        .context("cannot run cargo")?;
    std::process::exit(status.code().unwrap_or(1));
}
