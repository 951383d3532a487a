//! `cargo xtask gpu-bundle`: builds the release binaries with `cuda,cudnn,nccl` (in
//! `target/gpu`, or `CARGO_TARGET_DIR`) and writes a folder that runs on a machine with CUDA 13
//! and no Rust toolchain: the stripped binaries (optionally xz-packed for transfer), `env.sh`,
//! the run scripts with the C sources of their injection libraries, compiled there
//! (`scripts/`), the PyTorch anchors (`python/`) and `manifest.json` naming the
//! commit, the features and every file. The CUPTI kernel tracer is compiled here when CUPTI's
//! headers are (`kernel_trace.so`); otherwise the bundle carries CUDA's `crt/` headers (`inc/`),
//! which `cupti.h` includes and the GPU machines' CUDA 13 wheels lack, and run-kernel-trace.sh
//! compiles it there.
//!
//! On the GPU machine: `source BUNDLE/env.sh` (unpacks, sets the library path), then e.g.
//! `WEFT_BUNDLE=BUNDLE bash BUNDLE/scripts/run-reference.sh` or `BUNDLE/xtask gpu-check`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::cuda_build::find_nvcc;
use crate::python::workspace_root;

const FEATURES: &str = "xtask/nccl,xtask/cudnn,weft-launch/nccl";
const BINARIES: [&str; 4] = [
    "xtask",
    "weft-run",
    "weft-collectives-selftest",
    "weft-bench-collectives",
];

#[derive(Debug, Args)]
pub struct GpuBundleArgs {
    /// Folder to write (replaced if it exists)
    #[arg(long, default_value = ".gpu")]
    out: PathBuf,
    /// Pack the binaries with xz (env.sh unpacks them on the GPU machine)
    #[arg(long, default_value_t = false)]
    xz: bool,
    /// Compute capabilities to build weft's kernels for, e.g. 80,90 for a bundle that runs on
    /// A100s and H100s (default: CUDA_COMPUTE_CAP, else the GPU nvidia-smi finds); Candle's own
    /// kernels are built for the lowest (the driver compiles their PTX for newer GPUs)
    #[arg(long, value_name = "LIST")]
    compute_caps: Option<String>,
}

pub fn run(args: &GpuBundleArgs) -> Result<()> {
    if find_nvcc().is_none() {
        bail!("gpu-bundle: no CUDA toolkit found (nvcc is neither on PATH nor in CUDA_HOME/bin); see README, Running on GPUs");
    }
    let root = workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/gpu"));
    let mut build = Command::new(env!("CARGO"));
    build
        .args(["build", "--release", "-p", "xtask", "-p", "weft-launch"])
        .args(["--bins", "--features", FEATURES])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(&root);
    if let Some(list) = &args.compute_caps {
        let caps = weft_cuda_build::parse_caps(list)
            .map_err(|why| anyhow::anyhow!("--compute-caps {list}: {why}"))?;
        build
            .env("WEFT_CUDA_COMPUTE_CAPS", list)
            .env("CUDA_COMPUTE_CAP", caps[0].to_string());
    }
    let status = build.status().context("cannot run cargo")?;
    if !status.success() {
        bail!("gpu-bundle: the CUDA build failed ({status})");
    }
    let out = &args.out;
    if out.exists() {
        std::fs::remove_dir_all(out)
            .with_context(|| format!("cannot replace {}", out.display()))?;
    }
    std::fs::create_dir_all(out.join("scripts"))?;
    std::fs::create_dir_all(out.join("python"))?;
    let mut files = Vec::new();
    for name in BINARIES {
        files.push(place_binary(
            &target.join("release").join(name),
            out,
            args.xz,
        )?);
    }
    std::fs::copy(root.join("xtask/gpu/env.sh"), out.join("env.sh"))?;
    files.push("env.sh".to_string());
    for (from, to) in [("xtask/gpu", "scripts"), ("xtask/python", "python")] {
        for entry in std::fs::read_dir(root.join(from))? {
            let path = entry?.path();
            let keep = matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("sh" | "py" | "c")
            ) && path.file_name() != Some("env.sh".as_ref());
            if keep {
                let name = path.file_name().expect("a file").to_string_lossy();
                std::fs::copy(&path, out.join(to).join(name.as_ref()))?;
                files.push(format!("{to}/{name}"));
            }
        }
    }
    files.extend(kernel_tracer(&root, out)?);
    files.sort();
    let manifest = manifest(&root, &files)?;
    std::fs::write(
        out.join("manifest.json"),
        serde_json::to_string_pretty(&manifest)?,
    )?;
    println!(
        "gpu-bundle: {} ({} files, commit {})",
        out.display(),
        files.len() + 1,
        manifest["commit"].as_str().unwrap_or("?")
    );
    Ok(())
}

/// Compiles `xtask/gpu/kernel_trace.c` into the bundle's `kernel_trace.so` when CUPTI's headers
/// are found (`CUPTI_HOME`, else `/opt/cupti/nvidia/cu13`, beside CUDA_HOME's runtime headers);
/// when they are not, copies CUDA_HOME's `include/crt` into the bundle's `inc/` for
/// run-kernel-trace.sh to compile it there with. Returns the files it added.
fn kernel_tracer(root: &Path, out: &Path) -> Result<Vec<String>> {
    let cupti = std::env::var_os("CUPTI_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/cupti/nvidia/cu13"));
    let Some(cuda) = std::env::var_os("CUDA_HOME").map(PathBuf::from) else {
        println!("gpu-bundle: no CUDA_HOME: kernel_trace.so is left to run-kernel-trace.sh");
        return Ok(Vec::new());
    };
    if !cupti.join("include/cupti.h").is_file() {
        println!(
            "gpu-bundle: no CUPTI headers at {} (CUPTI_HOME): kernel_trace.so is left to \
             run-kernel-trace.sh, with CUDA's crt/ headers in inc/",
            cupti.display()
        );
        return runtime_headers(&cuda, out);
    }
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2"])
        .arg(format!("-I{}", cupti.join("include").display()))
        .arg(format!("-I{}", cuda.join("include").display()))
        .arg("-o")
        .arg(out.join("kernel_trace.so"))
        .arg(root.join("xtask/gpu/kernel_trace.c"))
        .arg(format!("-L{}", cupti.join("lib").display()))
        .arg("-l:libcupti.so.13")
        .status()
        .context("cannot run cc for kernel_trace.c")?;
    if !status.success() {
        bail!("gpu-bundle: compiling xtask/gpu/kernel_trace.c failed ({status})");
    }
    Ok(vec!["kernel_trace.so".to_string()])
}

/// CUDA_HOME's `include/crt` headers (which `cupti.h` includes and the GPU machines' CUDA 13
/// wheels lack) copied into the bundle's `inc/crt`; their names in the bundle.
fn runtime_headers(cuda: &Path, out: &Path) -> Result<Vec<String>> {
    let from = cuda.join("include/crt");
    if !from.join("host_defines.h").is_file() {
        return Ok(Vec::new());
    }
    std::fs::create_dir_all(out.join("inc/crt"))?;
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&from)? {
        let path = entry?.path();
        if path.is_file() {
            let name = path
                .file_name()
                .expect("a file")
                .to_string_lossy()
                .to_string();
            std::fs::copy(&path, out.join("inc/crt").join(&name))?;
            names.push(format!("inc/crt/{name}"));
        }
    }
    Ok(names)
}

/// Copies a binary into the bundle, stripped when `strip` is available, packed with xz when
/// asked; returns its name in the bundle.
fn place_binary(binary: &Path, out: &Path, xz: bool) -> Result<String> {
    let name = binary.file_name().context("binary path")?.to_string_lossy();
    let target = out.join(name.as_ref());
    let stripped = Command::new("strip")
        .arg("-o")
        .arg(&target)
        .arg(binary)
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        std::fs::copy(binary, &target)
            .with_context(|| format!("cannot copy {}", binary.display()))?;
    }
    if !xz {
        return Ok(name.into_owned());
    }
    let status = Command::new("xz")
        .args(["-f", "-T0"])
        .arg(&target)
        .status()
        .context("cannot run xz")?;
    if !status.success() {
        bail!("gpu-bundle: xz failed on {}", target.display());
    }
    Ok(format!("{name}.xz"))
}

/// What the bundle holds and where it comes from.
fn manifest(root: &Path, files: &[String]) -> Result<serde_json::Value> {
    let git = |args: &[&str]| -> String {
        Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let commit = git(&["rev-parse", "HEAD"]);
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
    let built = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(serde_json::json!({
        "commit": commit,
        "uncommitted_changes": dirty,
        "features": FEATURES,
        "built_unix_time": built,
        "requires": "Linux x86-64, NVIDIA driver for CUDA 13, CUDA 13 / cuDNN 9 / NCCL 2.2x libraries (PyTorch's nvidia-* wheels; env.sh finds them)",
        "files": files,
    }))
}
