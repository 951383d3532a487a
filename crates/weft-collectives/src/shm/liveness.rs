//! Liveness of the ranks a wait is for: whether they rejected the current operation, left
//! the communicator, failed (and which dead rank they blamed), whether their process still
//! exists (`kill(pid, 0)`, zombie state), and whether their heartbeat still moves.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;

use crate::error::{CommError, Result};
use crate::shm::layout::status;
use crate::shm::sync::WaitContext;

/// Last heartbeat value seen per rank, and since when.
#[derive(Default)]
pub(crate) struct HeartbeatWatch {
    seen: Vec<Option<(u64, Instant)>>,
}

impl HeartbeatWatch {
    /// How long `rank`'s heartbeat has stayed at `value`.
    fn unchanged_for(&mut self, rank: usize, value: u64, now: Instant) -> Duration {
        if self.seen.len() <= rank {
            self.seen.resize(rank + 1, None);
        }
        match self.seen[rank] {
            Some((last, since)) if last == value => now.duration_since(since),
            _ => {
                self.seen[rank] = Some((value, now));
                Duration::ZERO
            }
        }
    }
}

/// Checks the ranks still awaited, reporting the most direct cause first: a rank that
/// rejected this operation, then a dead one, then one that failed (naming the rank whose
/// death made it fail, when it recorded one).
pub(crate) fn check_alive(
    ctx: &WaitContext<'_>,
    missing: &[usize],
    heartbeats: &mut HeartbeatWatch,
    now: Instant,
) -> Result<()> {
    let region = ctx.region;
    let pid_of = |rank: usize| region.pid(rank).load(Ordering::Acquire) as i32;
    let died = |rank: usize, reason: String| CommError::PeerDied {
        rank,
        pid: pid_of(rank),
        op: ctx.op,
        reason,
    };
    if let Some(seq) = ctx.op_seq {
        if let Some(&rank) = missing
            .iter()
            .find(|&&r| region.rejected_op(r).load(Ordering::Acquire) == seq + 1)
        {
            return Err(CommError::PeerFailed {
                rank,
                op: ctx.op,
                reason: "it rejected this operation's arguments (see its own error)".into(),
            });
        }
    }
    for &rank in missing {
        let rank_status = region.status(rank).load(Ordering::Acquire);
        // A rank that failed because it saw another die may have exited since: the rank it
        // saw die is the cause, not its own exit.
        let blamed = region.blamed(rank).load(Ordering::Acquire);
        if rank_status == status::FAILED && blamed != 0 {
            return Err(died(blamed as usize - 1, format!("rank {rank} saw it die")));
        }
        if rank_status == status::EXITED {
            return Err(died(rank, "it left the communicator".into()));
        }
        let pid = pid_of(rank);
        if pid > 0 && pid as u32 != std::process::id() {
            if let Some(reason) = process_gone(pid) {
                return Err(died(rank, reason.into()));
            }
        }
        if rank_status == status::ALIVE {
            let beat = region.heartbeat(rank).load(Ordering::Acquire);
            let still = heartbeats.unchanged_for(rank, beat, now);
            if still > ctx.config.heartbeat_timeout {
                let reason = format!(
                    "no heartbeat for {:.1} s (process frozen or dead)",
                    still.as_secs_f64()
                );
                return Err(died(rank, reason));
            }
        }
    }
    if let Some(&rank) = missing
        .iter()
        .find(|&&r| region.status(r).load(Ordering::Acquire) == status::FAILED)
    {
        return Err(match region.blamed(rank).load(Ordering::Acquire) {
            0 => CommError::PeerFailed {
                rank,
                op: ctx.op,
                reason: "it failed an earlier operation".into(),
            },
            blamed => died(blamed as usize - 1, format!("rank {rank} saw it die")),
        });
    }
    Ok(())
}

/// Why process `pid` can no longer take part, or `None` while it is running.
fn process_gone(pid: i32) -> Option<&'static str> {
    match kill(Pid::from_raw(pid), None) {
        Err(Errno::ESRCH) => Some("its process no longer exists"),
        _ if is_zombie(pid) => Some("its process has exited"),
        _ => None,
    }
}

fn is_zombie(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The command name is in parentheses and may contain anything, so parse after the last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state == "Z" || state == "X")
}
