//! Writing a checkpoint under a time limit of its own (`--save-timeout`). Each rank's part is
//! gathered to the host first; then its files are written on a thread of its own while the
//! ranks agree, by a small sum every 50 ms, on who has written. Nobody waits inside a collective
//! for a slow writer, so the collectives' timeout does not bound a save, and the save's own
//! limit does. A rank whose write fails, or that is still writing when the time is up, ends the
//! save on every rank, named in the error; the checkpoint is then only staged (`.partial`, no
//! record), so the previous one stays the newest.

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use weft_parallel::zero::shard_part::ShardPart;

use crate::distributed::RankContext;
use crate::gpt_checkpoint::TensorParallelPart;

/// How often the ranks compare notes while they write.
const POLL: Duration = Duration::from_millis(50);

/// A rank's part of a checkpoint, in either format.
pub enum Part {
    /// weft-parallel's sharded format: this rank's part when it writes one.
    Sharded(Option<ShardPart>),
    /// The tensor-parallel format.
    TensorParallel(TensorParallelPart),
}

/// What is written on the writer thread.
pub trait Writes: Send + 'static {
    /// Writes the files; no communication.
    fn write(&self) -> Result<()>;
}

impl Writes for Part {
    fn write(&self) -> Result<()> {
        match self {
            Part::Sharded(Some(part)) => Ok(part.write()?),
            Part::Sharded(None) => Ok(()),
            Part::TensorParallel(part) => part.write(),
        }
    }
}

impl Part {
    /// Commits the written parts in order on every rank of `ctx` (a collective): the sharded
    /// folders renamed into place, then the tensor-parallel manifests.
    pub fn commit(self, ctx: &RankContext) -> Result<()> {
        match self {
            Part::Sharded(part) => {
                if let Some(part) = part {
                    part.commit()?;
                }
                ctx.barrier()
            }
            Part::TensorParallel(mut part) => {
                part.commit_shards()?;
                ctx.barrier()?;
                part.commit()?;
                ctx.barrier()
            }
        }
    }
}

/// Writes `part` (of checkpoint `dir`) on a thread while every rank of `ctx` waits for all to
/// have written, at most `timeout`; returns the part to commit.
pub fn write_everywhere<P: Writes>(
    part: P,
    ctx: &RankContext,
    dir: &Path,
    timeout: Duration,
) -> Result<P> {
    let (done, finished) = mpsc::channel();
    let writer = std::thread::Builder::new()
        .name("checkpoint-writer".into())
        .spawn(move || {
            let result = part.write();
            let _ = done.send(());
            (part, result)
        })
        .context("cannot start the checkpoint's writer thread")?;
    let start = Instant::now();
    let world = ctx.world_size;
    let mut written = false;
    loop {
        if !written {
            written = finished.recv_timeout(POLL).is_ok();
        }
        // One slot a rank (1: written), and one counting the ranks out of time.
        let mut notes = vec![0.0; world + 1];
        notes[ctx.rank] = f64::from(u8::from(written));
        notes[world] = f64::from(u8::from(start.elapsed() > timeout));
        ctx.sum(&mut notes)?;
        if notes[..world].iter().all(|&n| n > 0.0) {
            break;
        }
        if notes[world] > 0.0 {
            let writing: Vec<usize> = (0..world).filter(|&r| notes[r] == 0.0).collect();
            bail!(
                "{}: rank(s) {writing:?} still writing after {timeout:?} (--save-timeout); the previous checkpoint stays the newest",
                dir.display()
            );
        }
    }
    let (part, result) = writer
        .join()
        .map_err(|_| anyhow::anyhow!("{}: the checkpoint's writer panicked", dir.display()))?;
    let mut failed = vec![0.0; world];
    failed[ctx.rank] = f64::from(u8::from(result.is_err()));
    ctx.sum(&mut failed)?;
    result
        .with_context(|| format!("{}: rank {} cannot write its part", dir.display(), ctx.rank))?;
    if let Some(rank) = failed.iter().position(|&f| f > 0.0) {
        bail!(
            "{}: rank {rank} cannot write its part (its log says why)",
            dir.display()
        );
    }
    Ok(part)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use weft_testing::on_thread_ranks;

    use super::*;

    /// A part that takes `delay` to write and then fails or not.
    struct Sleepy {
        delay: Duration,
        fails: bool,
    }

    impl Writes for Sleepy {
        fn write(&self) -> Result<()> {
            std::thread::sleep(self.delay);
            match self.fails {
                true => bail!("disk full"),
                false => Ok(()),
            }
        }
    }

    /// Two ranks writing `parts[rank]` with `timeout`: each rank's error (empty when none).
    fn save(parts: [Sleepy; 2], timeout: Duration) -> Vec<String> {
        let parts = Mutex::new(parts.map(Some));
        let errors = Mutex::new(vec![String::new(); 2]);
        on_thread_ranks(2, |rank, comm| {
            let ctx = RankContext {
                rank,
                world_size: 2,
                comm: Some(comm as Arc<_>),
            };
            let part = parts.lock().unwrap()[rank].take().unwrap();
            let dir = Path::new("run/checkpoints/step-00000004");
            if let Err(err) = write_everywhere(part, &ctx, dir, timeout) {
                errors.lock().unwrap()[rank] = format!("{err:#}");
            }
        });
        errors.into_inner().unwrap()
    }

    fn sleepy(millis: u64, fails: bool) -> Sleepy {
        Sleepy {
            delay: Duration::from_millis(millis),
            fails,
        }
    }

    /// A write longer than the collectives would wait is fine within the save's own limit
    /// (the shm backend's timeout is far longer than this, but no rank sits in a collective
    /// while another writes: they meet every 50 ms).
    #[test]
    fn slow_writes_finish_and_every_rank_learns_of_a_late_or_failed_one() {
        assert_eq!(
            save(
                [sleepy(0, false), sleepy(300, false)],
                Duration::from_secs(30)
            ),
            ["", ""]
        );
        let late = save(
            [sleepy(0, false), sleepy(3_000, false)],
            Duration::from_millis(300),
        );
        for err in &late {
            assert!(
                err.contains(
                    "step-00000004: rank(s) [1] still writing after 300ms (--save-timeout)"
                ),
                "{late:?}"
            );
        }
        let failed = save(
            [sleepy(0, true), sleepy(100, false)],
            Duration::from_secs(30),
        );
        assert!(
            failed[0].contains("rank 0 cannot write its part") && failed[0].contains("disk full"),
            "{failed:?}"
        );
        assert!(
            failed[1].contains("rank 0 cannot write its part (its log says why)"),
            "{failed:?}"
        );
    }
}
