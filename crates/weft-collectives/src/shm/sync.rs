//! Waiting for other ranks through counters in shared memory: spin, then sleep on the
//! awaited rank's stage counter (a futex its next `arrive` wakes), or, for other counters,
//! yield and sleep in proportion to the time already waited. Every wait is bounded by the
//! configured timeout and periodically checks that the ranks it waits for are alive
//! (see the `liveness` module).

use std::time::{Duration, Instant};

use crate::error::{CommError, Result};
use crate::shm::config::ShmConfig;
use crate::shm::futex::sleep_on;
use crate::shm::layout::Region;
use crate::shm::liveness::{check_alive, HeartbeatWatch};
use std::sync::atomic::Ordering;

/// What a wait is for: the region, the limits, and the operation to name in errors.
pub(crate) struct WaitContext<'a> {
    pub(crate) region: &'a Region,
    pub(crate) config: &'a ShmConfig,
    pub(crate) op: &'static str,
    /// Sequence number of the collective being run, to notice ranks that rejected it.
    pub(crate) op_seq: Option<u64>,
}

/// How long a waiter spins before it yields or sleeps.
const SPIN: Duration = Duration::from_micros(50);
/// Longest single futex sleep, so liveness checks keep their rhythm.
const MAX_SLEEP: Duration = Duration::from_millis(10);

/// Blocks until `ready(rank)` holds for every rank in `ranks`, polling with backoff.
pub(crate) fn wait_until(
    ctx: &WaitContext<'_>,
    ranks: impl Iterator<Item = usize> + Clone,
    ready: impl Fn(usize) -> bool,
) -> Result<()> {
    wait_loop(ctx, ranks, ready, |_, _| false)
}

/// Blocks until every rank in `ranks` has reached stage `target`. After a short spin the
/// waiter sleeps on the stage counter of the first rank it still waits for.
pub(crate) fn wait_stages(
    ctx: &WaitContext<'_>,
    ranks: impl Iterator<Item = usize> + Clone,
    target: u64,
) -> Result<()> {
    let region = ctx.region;
    let ready = |rank: usize| region.stage(rank).load(Ordering::Acquire) >= target;
    wait_loop(ctx, ranks, ready, |rank, timeout| {
        let done = || region.stage(rank).load(Ordering::SeqCst) >= target;
        sleep_on(
            region.stage(rank),
            region.stage_sleepers(rank),
            done,
            timeout,
        );
        true
    })
}

/// The wait loop: `sleep(rank, timeout)` blocks until `rank` may have made progress and
/// returns true, or returns false to fall back to spinning, yielding and short sleeps.
fn wait_loop(
    ctx: &WaitContext<'_>,
    ranks: impl Iterator<Item = usize> + Clone,
    ready: impl Fn(usize) -> bool,
    sleep: impl Fn(usize, Duration) -> bool,
) -> Result<()> {
    if ranks.clone().all(&ready) {
        return Ok(());
    }
    let start = Instant::now();
    let mut next_check = start + ctx.config.liveness_interval;
    let mut heartbeats = HeartbeatWatch::default();
    loop {
        let waited = start.elapsed();
        let slept = match ranks.clone().find(|&r| !ready(r)) {
            Some(rank) if waited >= SPIN => {
                let until_check = next_check.saturating_duration_since(start + waited);
                sleep(
                    rank,
                    until_check.clamp(Duration::from_micros(100), MAX_SLEEP),
                )
            }
            _ => false,
        };
        if !slept {
            pause(waited);
        }
        if ranks.clone().all(&ready) {
            return Ok(());
        }
        let now = Instant::now();
        if now >= next_check {
            let missing: Vec<usize> = ranks.clone().filter(|&r| !ready(r)).collect();
            check_alive(ctx, &missing, &mut heartbeats, now)?;
            next_check = now + ctx.config.liveness_interval;
        }
        let waited = now.duration_since(start);
        if waited >= ctx.config.timeout {
            return Err(CommError::Timeout {
                op: ctx.op,
                waited,
                missing: ranks.filter(|&r| !ready(r)).collect(),
            });
        }
    }
}

fn pause(waited: Duration) {
    if waited < SPIN {
        for _ in 0..32 {
            std::hint::spin_loop();
        }
    } else if waited < Duration::from_millis(2) {
        std::thread::yield_now();
    } else {
        std::thread::sleep((waited / 20).min(Duration::from_micros(500)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::layout::status;
    use crate::shm::layout::Layout;
    use crate::shm::segment::new_segment_name;

    fn test_region(world_size: usize) -> Region {
        let region = Region::create(
            &new_segment_name("sync"),
            Layout::new(world_size, 4096, 128),
        )
        .unwrap();
        region.segment().unlink().unwrap();
        region
    }

    fn quick_config() -> ShmConfig {
        ShmConfig {
            timeout: Duration::from_millis(300),
            liveness_interval: Duration::from_millis(10),
            heartbeat_timeout: Duration::from_millis(100),
            heartbeat_interval: Duration::from_millis(20),
            ..ShmConfig::default()
        }
    }

    fn wait_stage(region: &Region, config: &ShmConfig, target: u64) -> Result<()> {
        let ctx = WaitContext {
            region,
            config,
            op: "test_op",
            op_seq: Some(4),
        };
        wait_stages(&ctx, 0..region.layout().world_size, target)
    }

    #[test]
    fn timeouts_name_the_missing_ranks() {
        let (region, config) = (test_region(3), quick_config());
        region.stage(1).store(5, Ordering::Release);
        match wait_stage(&region, &config, 5) {
            Err(CommError::Timeout {
                op: "test_op",
                missing,
                ..
            }) => assert_eq!(missing, vec![0, 2]),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn dead_exited_failed_and_rejecting_ranks_are_reported() {
        let config = quick_config();
        let region = test_region(2);
        region.stage(0).store(1, Ordering::Release);
        // A pid that cannot exist on Linux (above pid_max).
        region.pid(1).store(i32::MAX as u64, Ordering::Release);
        let err = wait_stage(&region, &config, 1).unwrap_err();
        assert!(matches!(err, CommError::PeerDied { rank: 1, .. }), "{err}");

        let cases = [
            (status::EXITED, 0, "left"),
            (status::FAILED, 0, "earlier"),
            (status::ALIVE, 5, "rejected"),
            (status::ALIVE, 0, "heartbeat"),
        ];
        for (rank_status, rejected, needle) in cases {
            let region = test_region(2);
            region.stage(0).store(1, Ordering::Release);
            region.status(1).store(rank_status, Ordering::Release);
            region.rejected_op(1).store(rejected, Ordering::Release);
            let err = wait_stage(&region, &config, 1).unwrap_err();
            assert!(err.to_string().contains(needle), "{err}");
            assert!(err.to_string().contains("rank 1"), "{err}");
        }
    }

    #[test]
    fn a_rank_that_failed_because_a_peer_died_names_that_peer() {
        let (region, config) = (test_region(3), quick_config());
        region.stage(0).store(1, Ordering::Release);
        region.stage(1).store(1, Ordering::Release);
        region.status(2).store(status::FAILED, Ordering::Release);
        region.blamed(2).store(2, Ordering::Release);
        region.pid(1).store(1234, Ordering::Release);
        match wait_stage(&region, &config, 1) {
            Err(CommError::PeerDied {
                rank: 1,
                pid: 1234,
                reason,
                ..
            }) => assert!(reason.contains("rank 2")),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn waits_return_once_counters_advance() {
        let (region, config) = (test_region(2), quick_config());
        let advanced = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                region.stage(0).store(2, Ordering::Release);
                advanced.store(true, Ordering::SeqCst);
                region.stage(1).store(3, Ordering::Release);
            });
            wait_stage(&region, &config, 2).unwrap();
            // Both counters had to reach 2: the wait outlasted the other thread's stores.
            assert!(
                advanced.load(Ordering::SeqCst),
                "returned before the counters advanced"
            );
            assert!(region.stage(1).load(Ordering::Acquire) >= 2);
        });
    }
}
