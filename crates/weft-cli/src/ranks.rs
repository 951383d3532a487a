//! N ranks of this very program on this machine, through weft-launch's launcher in this
//! process (the same code as `weft run`), each with its share of the CPU threads.

use std::process::ExitCode;

use anyhow::{Context, Result};

/// Runs this program with `args` on `nproc` ranks and waits for them: the job's exit code
/// (a failed rank's, named by the launcher on standard error).
pub fn run(nproc: usize, args: &[String]) -> Result<ExitCode> {
    let me = std::env::current_exe().context("cannot find this program's path")?;
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // Inherited by the ranks the launcher starts.
        std::env::set_var("RAYON_NUM_THREADS", (cores / nproc).max(1).to_string());
    }
    let argv = [
        "weft-run".into(),
        "--nproc-per-node".into(),
        nproc.to_string(),
        "--".into(),
    ]
    .into_iter()
    .chain([me.to_string_lossy().into_owned()])
    .chain(args.iter().cloned());
    Ok(weft_launch::runner::main_from(argv.map(Into::into)))
}
