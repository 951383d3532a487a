//! Watching the ranks until all have exited. The first rank to fail (non-zero status or a
//! signal) starts the shutdown: the others get `exit_grace` to exit by themselves (they
//! notice the dead peer and report it), then SIGTERM, then SIGKILL after `kill_grace`.
//! Signals to the launcher are forwarded to every rank's process group and start the
//! shutdown at the SIGTERM step; a second signal goes straight to SIGKILL.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::ranks::Rank;
use super::signals;

/// Why the job ended.
pub enum Outcome {
    Succeeded,
    RankFailed {
        rank: usize,
        pid: i32,
        status: ExitStatus,
    },
    Interrupted(Signal),
}

enum Phase {
    Running,
    Draining(Instant),
    Terminating(Instant),
    Killing,
}

const POLL: Duration = Duration::from_millis(20);

/// Supervises `ranks` until every one has exited.
pub fn supervise(ranks: &mut [Rank], exit_grace: Duration, kill_grace: Duration) -> Outcome {
    let mut outcome = Outcome::Succeeded;
    let mut phase = Phase::Running;
    loop {
        let mut failed_now: Vec<(usize, i32, ExitStatus)> = Vec::new();
        for rank in ranks.iter_mut() {
            let newly_exited = rank.status.is_none() && rank.poll();
            if let (true, Some(status)) = (newly_exited, rank.status) {
                if !status.success() {
                    failed_now.push((rank.rank, rank.pid, status));
                }
            }
        }
        // Of ranks that failed within one poll, one killed by a signal is more likely the
        // cause than one that exited with an error after noticing it.
        failed_now.sort_by_key(|(_, _, status)| status.signal().is_none());
        if let (Some(&(rank, pid, status)), Outcome::Succeeded) = (failed_now.first(), &outcome) {
            outcome = Outcome::RankFailed { rank, pid, status };
            if matches!(phase, Phase::Running) {
                phase = Phase::Draining(Instant::now() + exit_grace);
            }
        }
        if let Some(signal) = signals::take() {
            if matches!(outcome, Outcome::Succeeded) {
                outcome = Outcome::Interrupted(signal);
            }
            phase = match phase {
                Phase::Running | Phase::Draining(_) => {
                    signal_living(ranks, signal);
                    Phase::Terminating(Instant::now() + kill_grace)
                }
                Phase::Terminating(_) | Phase::Killing => {
                    signal_living(ranks, Signal::SIGKILL);
                    Phase::Killing
                }
            };
        }
        if ranks.iter().all(|rank| rank.status.is_some()) {
            return outcome;
        }
        let now = Instant::now();
        phase = match phase {
            Phase::Draining(deadline) if now >= deadline => {
                signal_living(ranks, Signal::SIGTERM);
                Phase::Terminating(now + kill_grace)
            }
            Phase::Terminating(deadline) if now >= deadline => {
                signal_living(ranks, Signal::SIGKILL);
                Phase::Killing
            }
            other => other,
        };
        thread::sleep(POLL);
    }
}

fn signal_living(ranks: &[Rank], signal: Signal) {
    for rank in ranks.iter().filter(|rank| rank.status.is_none()) {
        rank.signal_group(signal);
    }
}

/// Kills whatever is left in the ranks' process groups, then waits briefly for the output
/// relays to drain (a process that escaped its group could hold a pipe open forever).
pub fn sweep(ranks: &[Rank]) {
    for rank in ranks {
        rank.signal_group(Signal::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while !ranks.iter().all(Rank::relays_done) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
}
