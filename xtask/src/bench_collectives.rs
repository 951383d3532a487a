//! `cargo xtask bench-collectives`: weft's collectives (nccl-tests style table from
//! `weft-bench-collectives` under `weft-run`), then torch.distributed with the same process
//! count and sizes in the same run (gloo for shm, NCCL for nccl), and the ratios per size.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::launch::{build_launcher, collectives_binary};
use crate::python;

#[derive(Debug, Args)]
pub struct BenchCollectivesArgs {
    /// shm (CPU processes, anchor: gloo) or nccl (one process per GPU, anchor: torch's NCCL;
    /// needs the GPU build)
    #[arg(long, default_value = "shm")]
    pub backend: String,
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
    /// Skip the torch.distributed anchor
    #[arg(long, default_value_t = false)]
    no_anchor: bool,
}

type Key = (String, usize);

pub fn run(args: &BenchCollectivesArgs) -> Result<()> {
    let (device, anchor_backend) = match args.backend.as_str() {
        "shm" => ("cpu", "gloo"),
        "nccl" => ("cuda", "nccl"),
        other => bail!("--backend {other}: expected shm or nccl"),
    };
    let json = args.json.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("weft-bench-{}.jsonl", std::process::id()))
    });
    let _ = std::fs::remove_file(&json);
    let launcher = build_launcher()?;
    let bench = collectives_binary("weft-bench-collectives")?;
    let status = Command::new(&launcher)
        .args(["--nproc-per-node", &args.nproc.to_string(), "--"])
        .arg(&bench)
        .args(["--device", device, "--ops", &args.ops])
        .args(["--min-bytes", &args.min_bytes.to_string()])
        .args(["--max-bytes", &args.max_bytes.to_string()])
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
        .arg(python::script("bench_collectives_torch.py"))
        .args(["--backend", anchor_backend])
        .args(["--nproc", &args.nproc.to_string(), "--ops", &args.ops])
        .args(["--min-bytes", &args.min_bytes.to_string()])
        .args(["--max-bytes", &args.max_bytes.to_string()])
        .args(["--iters", &args.iters.to_string()])
        .output()
        .context("cannot run the torch.distributed anchor")?;
    if !output.status.success() {
        bail!(
            "torch.distributed anchor ({anchor_backend}) failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let anchor = String::from_utf8_lossy(&output.stdout).to_string();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&json)?
        .write_all(anchor.as_bytes())?;
    print_comparison(&json, &args.backend, &format!("torch-{anchor_backend}"))
}

fn print_comparison(json: &Path, ours: &str, theirs: &str) -> Result<()> {
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
    let weft = by_backend
        .get(ours)
        .with_context(|| format!("no {ours} measurements"))?;
    let anchor = by_backend.get(theirs).cloned().unwrap_or_default();
    println!(
        "\n{:<15} {:>10} {:>12} {:>12} {:>12} {:>12} {:>8} {:>8}",
        "op", "bytes", "weft us", "anchor us", "weft busbw", "anchor busbw", "bw x", "lat x"
    );
    for ((op, bytes), (t, bw)) in weft {
        match anchor.get(&(op.clone(), *bytes)) {
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
        "(anchor: {theirs}; bw x = weft busbw / anchor busbw; lat x = anchor time / weft time; measurements in {})",
        json.display()
    );
    print_against_memcpy(weft);
    Ok(())
}

/// Each operation's bus bandwidth at 64 MiB as a share of the memcpy ceiling (shm only: the
/// ceiling is measured beside the CPU backend).
fn print_against_memcpy(weft: &BTreeMap<Key, (f64, f64)>) {
    const AT: usize = 64 << 20;
    let Some((_, ceiling)) = weft.get(&("memcpy".to_string(), AT)) else {
        return;
    };
    for ((op, bytes), (_, busbw)) in weft {
        if *bytes == AT && op != "memcpy" {
            println!(
                "{op} at 64 MiB: bus bandwidth {busbw:.2} GB/s = {:.0}% of the memcpy ceiling ({ceiling:.2} GB/s)",
                100.0 * busbw / ceiling
            );
        }
    }
}
