//! The run's timeline on disk: each rank streams `trace-rank<R>.json` into the run folder,
//! flushed after every step (so a long run holds one step's spans in memory and a crash keeps
//! what was flushed); at the end rank 0 joins the ranks' files into `trace.json`, one process
//! per rank on one clock, for Perfetto or `chrome://tracing`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use weft_tensor::timeline::chrome::merge_traces;
use weft_tensor::Timeline;

use crate::distributed::RankContext;

/// `RUN/trace-rank<R>.json`.
pub fn rank_trace(run: &Path, rank: usize) -> PathBuf {
    run.join(format!("trace-rank{rank}.json"))
}

/// Streams `timeline` into the run folder `run` from now on.
pub fn stream(timeline: &Timeline, run: &Path) -> Result<()> {
    let path = rank_trace(run, timeline.rank());
    timeline
        .stream_to(&path)
        .with_context(|| format!("{}: cannot create the trace", path.display()))
}

/// Closes this rank's trace; once every rank has, rank 0 writes `RUN/trace.json` from the
/// ranks' traces it can see (all of them when the run folder is shared).
pub fn finish(timeline: &Timeline, run: &Path, ctx: &RankContext) -> Result<()> {
    let path = rank_trace(run, ctx.rank);
    timeline
        .finish()
        .with_context(|| format!("{}: cannot write the trace", path.display()))?;
    ctx.barrier()?;
    if ctx.is_main() {
        let inputs: Vec<PathBuf> = (0..ctx.world_size)
            .map(|r| rank_trace(run, r))
            .filter(|p| p.exists())
            .collect();
        let merged = run.join("trace.json");
        merge_traces(&inputs, &merged)
            .with_context(|| format!("{}: cannot merge the ranks' traces", merged.display()))?;
    }
    Ok(())
}
