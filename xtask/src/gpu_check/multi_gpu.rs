//! gpu-check's rows that need two GPUs, each a job of two processes started by `weft-run`
//! (binaries beside this one, or built with cargo): every NCCL collective against values each
//! rank can compute (the collectives self-test, host buffers and device tensors), and
//! data-parallel training on two GPUs against one ([`super::ddp`]).

use std::process::Command;

use anyhow::{Context, Result};

use super::ddp::ROW;
use super::Check;
use crate::launch::{build_launcher, collectives_binary};

/// Whether this machine has a second GPU.
pub(super) fn has_two_gpus() -> bool {
    candle_core::Device::new_cuda(1).is_ok()
}

/// Runs `program ARGS` on 2 ranks; returns its exit success and standard output.
fn two_ranks(program: &std::path::Path, args: &[&str]) -> Result<(bool, String)> {
    let launcher = build_launcher()?;
    let output = Command::new(&launcher)
        .args(["--nproc-per-node", "2", "--"])
        .arg(program)
        .args(args)
        .env("WEFT_TIMEOUT", "120")
        .output()
        .with_context(|| format!("cannot start {}", launcher.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        eprintln!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    }
    Ok((output.status.success(), stdout))
}

/// Appends the two-GPU rows to `checks`.
pub(super) fn run(checks: &mut Vec<Check>) -> Result<()> {
    let selftest = collectives_binary("weft-collectives-selftest")?;
    let (ok, _) = two_ranks(&selftest, &["--device", "cuda", "collectives"])?;
    checks.push(Check {
        name: "NCCL collectives, 2 GPUs (self-test)".into(),
        error: if ok { 0.0 } else { f64::INFINITY },
        tolerance: 0.0,
    });
    let me = std::env::current_exe().context("cannot find the xtask binary")?;
    let (ok, stdout) = two_ranks(&me, &["gpu-check-ddp"])?;
    let mut rows = 0;
    for line in stdout.lines() {
        let Some(row) = line.split_once(ROW).map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = row.trim_start_matches('\t').split('\t').collect();
        if let [name, error, tolerance] = fields[..] {
            checks.push(Check {
                name: name.to_string(),
                error: error.parse().unwrap_or(f64::INFINITY),
                tolerance: tolerance.parse().unwrap_or(0.0),
            });
            rows += 1;
        }
    }
    if !ok || rows == 0 {
        checks.push(Check {
            name: "DDP 2 GPUs job completed".into(),
            error: f64::INFINITY,
            tolerance: 0.0,
        });
    }
    Ok(())
}
