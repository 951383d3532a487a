//! `cargo xtask bench-collectives`: weft's collectives (nccl-tests style table from
//! `weft-bench-collectives` under `weft-run`), then PyTorch's gloo backend with the same
//! process count and sizes in the same run, and the bus-bandwidth ratio per size.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::launch::build_launcher;
use crate::python;

#[derive(Debug, Args)]
pub struct BenchCollectivesArgs {
    /// shm (CPU processes); nccl needs the GPU build
    #[arg(long, default_value = "shm")]
    backend: String,
    #[arg(long, default_value_t = 2)]
    nproc: usize,
    #[arg(long, default_value = "all_reduce,reduce_scatter,all_gather")]
    ops: String,
    #[arg(long, default_value_t = 4096)]
    min_bytes: usize,
    #[arg(long, default_value_t = 256 << 20)]
    max_bytes: usize,
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Also write every measurement (weft and anchors) as JSON lines here
    #[arg(long)]
    json: Option<PathBuf>,
    /// Skip the gloo anchor
    #[arg(long, default_value_t = false)]
    no_anchor: bool,
}

type Key = (String, usize);

pub fn run(args: &BenchCollectivesArgs) -> Result<()> {
    if args.backend != "shm" {
        bail!("--backend {}: only shm is available in this build (the NCCL backend is not written yet)", args.backend);
    }
    let json = args.json.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("weft-bench-{}.jsonl", std::process::id()))
    });
    let _ = std::fs::remove_file(&json);
    let launcher = build_launcher()?;
    let bench = launcher.with_file_name("weft-bench-collectives");
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "--release",
            "--quiet",
            "-p",
            "weft-collectives",
            "--bin",
            "weft-bench-collectives",
        ])
        .status()?;
    if !status.success() {
        bail!("building weft-bench-collectives failed");
    }
    let status = Command::new(&launcher)
        .args(["--nproc-per-node", &args.nproc.to_string(), "--"])
        .arg(&bench)
        .args([
            "--ops",
            &args.ops,
            "--min-bytes",
            &args.min_bytes.to_string(),
            "--max-bytes",
            &args.max_bytes.to_string(),
        ])
        .args(["--iters", &args.iters.to_string(), "--json"])
        .arg(&json)
        .status()
        .context("cannot run weft-bench-collectives")?;
    if !status.success() {
        bail!("weft-bench-collectives failed ({status})");
    }
    if args.no_anchor {
        return Ok(());
    }
    let python = python::torch_python()?;
    let output = Command::new(python)
        .arg(python::script("bench_collectives_gloo.py"))
        .args(["--nproc", &args.nproc.to_string(), "--ops", &args.ops])
        .args([
            "--min-bytes",
            &args.min_bytes.to_string(),
            "--max-bytes",
            &args.max_bytes.to_string(),
        ])
        .args(["--iters", &args.iters.to_string()])
        .output()
        .context("cannot run the gloo anchor")?;
    if !output.status.success() {
        bail!(
            "gloo anchor failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let anchor = String::from_utf8_lossy(&output.stdout).to_string();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&json)?
        .write_all(anchor.as_bytes())?;
    print_comparison(&json)
}

fn print_comparison(json: &Path) -> Result<()> {
    let mut by_backend: BTreeMap<String, BTreeMap<Key, (f64, f64)>> = BTreeMap::new();
    for line in std::fs::read_to_string(json)?.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(op), Some(backend), Some(bytes)) =
            (v["op"].as_str(), v["backend"].as_str(), v["bytes"].as_u64())
        else {
            continue;
        };
        let entry = (
            v["time_us"].as_f64().unwrap_or(f64::NAN),
            v["busbw_gbps"].as_f64().unwrap_or(f64::NAN),
        );
        by_backend
            .entry(backend.into())
            .or_default()
            .insert((op.into(), bytes as usize), entry);
    }
    let weft = by_backend.get("shm").context("no shm measurements")?;
    let gloo = by_backend.get("gloo").cloned().unwrap_or_default();
    println!(
        "\n{:<15} {:>10} {:>12} {:>12} {:>12} {:>12} {:>8} {:>8}",
        "op", "bytes", "weft us", "gloo us", "weft busbw", "gloo busbw", "bw x", "lat x"
    );
    for ((op, bytes), (t, bw)) in weft {
        match gloo.get(&(op.clone(), *bytes)) {
            Some((gt, gbw)) => println!(
                "{op:<15} {bytes:>10} {t:>12.1} {gt:>12.1} {bw:>12.3} {gbw:>12.3} {:>8.2} {:>8.2}",
                bw / gbw,
                gt / t
            ),
            None => println!(
                "{op:<15} {bytes:>10} {t:>12.1} {:>12} {bw:>12.3} {:>12} {:>8} {:>8}",
                "-", "-", "-", "-"
            ),
        }
    }
    println!(
        "(bw x = weft busbw / gloo busbw; lat x = gloo time / weft time; measurements in {})",
        json.display()
    );
    Ok(())
}
