//! The launcher behind `weft-run` and `weft run`: a torchrun-like launcher for weft programs.
//!
//! `weft-run --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P]
//! -- PROGRAM ARGS…` starts N ranks with `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, `WEFT_JOB_ID` and a random
//! `WEFT_JOB_TOKEN` (the rest of the environment, such as `WEFT_TIMEOUT`, passes through),
//! and `NCCL_GRAPH_MIXING_SUPPORT=0` unless that is set (replayed CUDA graphs run faster; weft's
//! NCCL backend keeps the rule NCCL then leaves to the program).
//! If a rank fails, the others are stopped, leftover `/dev/shm/weft-<job>-*` segments are
//! removed, and the launcher exits non-zero naming the rank and how it ended.

mod args;
mod ranks;
mod signals;
mod supervise;

use std::os::unix::process::ExitStatusExt;
use std::process::ExitCode;

use clap::Parser;

pub use args::Args;

use args::Plan;
use ranks::{describe, Rank};
use supervise::{supervise, sweep, Outcome};

/// Parses the launcher's command line `argv` (its first item the program's name) and runs the
/// job; the exit code is the job's (a failed rank's), 2 for a bad command line.
pub fn main_from(argv: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    match Args::try_parse_from(argv) {
        Ok(args) => launch(args),
        Err(e) => e.exit(),
    }
}

/// Runs the job `args` describes; the exit code is the job's (a failed rank's), 2 when it
/// cannot start.
pub fn launch(args: Args) -> ExitCode {
    match run(args) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("weft-run: {message}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<ExitCode, String> {
    let plan = Plan::new(args)?;
    signals::install()?;
    let mut ranks = Vec::with_capacity(plan.local_world_size);
    for local_rank in 0..plan.local_world_size {
        match Rank::spawn(&plan, local_rank) {
            Ok(rank) => ranks.push(rank),
            Err(message) => {
                for rank in &ranks {
                    rank.signal_group(nix::sys::signal::Signal::SIGKILL);
                }
                sweep(&ranks);
                remove_segments(&plan.job_id);
                return Err(message);
            }
        }
    }
    let outcome = supervise(&mut ranks, plan.exit_grace, plan.kill_grace);
    sweep(&ranks);
    remove_segments(&plan.job_id);
    Ok(report(&outcome, &ranks))
}

fn remove_segments(job_id: &str) {
    match weft_collectives::shm::remove_job_segments(job_id) {
        Ok(removed) if !removed.is_empty() => {
            eprintln!("weft-run: removed leftover shared-memory segments {removed:?}");
        }
        Ok(_) => {}
        Err(e) => eprintln!(
            "weft-run: cannot scan {}: {e}",
            weft_collectives::shm::SHM_DIR
        ),
    }
}

fn report(outcome: &Outcome, ranks: &[Rank]) -> ExitCode {
    match outcome {
        Outcome::Succeeded => ExitCode::SUCCESS,
        Outcome::RankFailed { rank, pid, status } => {
            eprintln!("weft-run: rank {rank} (pid {pid}) {}", describe(status));
            for other in ranks.iter().filter(|r| r.rank != *rank) {
                if let Some(status) = &other.status {
                    eprintln!(
                        "weft-run: rank {} (pid {}) {}",
                        other.rank,
                        other.pid,
                        describe(status)
                    );
                }
            }
            let code = status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
            ExitCode::from(u8::try_from(code).ok().filter(|&c| c != 0).unwrap_or(1))
        }
        Outcome::Interrupted(signal) => {
            eprintln!("weft-run: stopped all ranks after receiving {signal}");
            ExitCode::from(128 + *signal as u8)
        }
    }
}
