//! The Python environment of the anchors: a virtual environment under `target/bench-venv` with
//! PyTorch and torchvision from PyPI, created on first use and reused afterwards.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The workspace root (this crate's parent folder), or the current folder for a binary
/// carried to a machine where the workspace it was built in does not exist.
pub fn workspace_root() -> PathBuf {
    let built_in = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf();
    if built_in.exists() {
        built_in
    } else {
        std::env::current_dir().unwrap_or(built_in)
    }
}

/// Path of the venv's python, creating the venv and installing torch + torchvision if needed.
/// `WEFT_ANCHOR_PYTHON` names an interpreter that already has them (e.g. on a GPU machine).
pub fn torch_python() -> Result<PathBuf> {
    if let Some(python) = std::env::var_os("WEFT_ANCHOR_PYTHON") {
        return Ok(PathBuf::from(python));
    }
    let venv = workspace_root().join("target/bench-venv");
    let python = venv.join("bin/python");
    if python.exists() && has_torch(&python) {
        eprintln!("anchor: reusing PyTorch in {}", venv.display());
        return Ok(python);
    }
    eprintln!(
        "anchor: installing torch and torchvision from PyPI into {} (several GB, once)",
        venv.display()
    );
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
        "python3 -m venv",
    )?;
    run(
        Command::new(&python).args(["-m", "pip", "install", "-q", "torch", "torchvision"]),
        "pip install torch torchvision",
    )?;
    Ok(python)
}

fn has_torch(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import torch, torchvision"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("{what}: cannot start"))?;
    if !status.success() {
        bail!("{what} failed with {status}");
    }
    Ok(())
}

/// Path of one of the anchor scripts in `xtask/python/`: under the current folder when run
/// from a checkout (a binary carried to another machine), in `python/` beside this binary when
/// it runs from a bundle of `cargo xtask gpu-bundle`, else in this workspace.
pub fn script(name: &str) -> PathBuf {
    let local = Path::new("xtask/python").join(name);
    if local.exists() {
        return local;
    }
    let bundled = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("python").join(name)));
    if let Some(bundled) = bundled.filter(|p| p.exists()) {
        return bundled;
    }
    workspace_root().join("xtask/python").join(name)
}
