//! NCCL with graph mixing turned off (`NCCL_GRAPH_MIXING_SUPPORT=0`, which `weft-run` sets).
//!
//! By default NCCL captures a cross-stream serialisation around every collective, so that
//! graph-captured and eager operations of one communicator may be outstanding together.
//! Without it a ResNet-50 DDP step replayed from a CUDA graph runs about 2 % faster on two and
//! four H100s (docs/history/2026-11.md, twenty-third session). NCCL then leaves one rule to the program:
//! no operation may be issued outside a capture while a graph launch holding the
//! communicator's operations may still run, and stream order is not enough.
//!
//! [`GraphMixing::settle`] keeps that rule for the NCCL backend. Once an operation of the
//! communicator has been captured, every operation issued outside a capture first waits, on
//! the host, for the compute-stream work queued before it, graph launches included. The wait is
//! watched: a failed communicator or the timeout ends it with an error. The rule lives here,
//! apart from the device, so that the CPU tests cover it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::{CommError, Result};

/// How long the host sleeps between two looks at the device.
const POLL: Duration = Duration::from_micros(20);

/// Whether NCCL mixes graph-captured and eager operations, and whether a communicator has had
/// an operation captured.
pub(crate) struct GraphMixing {
    mixing: bool,
    captured: AtomicBool,
}

impl GraphMixing {
    /// `mixing`: NCCL's support is on (its default).
    pub fn new(mixing: bool) -> Self {
        Self {
            mixing,
            captured: AtomicBool::new(false),
        }
    }

    /// An operation of the communicator is being captured into a CUDA graph.
    pub fn note_captured(&self) {
        self.captured.store(true, Ordering::Release);
    }

    /// Before operation `op` is issued outside a capture: with mixing off, once anything was
    /// captured, waits until `done` says the compute-stream work queued before `op` has
    /// completed, so that no graph launch still runs when NCCL is called. `check` is asked
    /// between looks (a failed communicator ends the wait with its error); after `timeout`
    /// the wait fails, naming `op`.
    pub fn settle(
        &self,
        op: &'static str,
        mut done: impl FnMut() -> Result<bool>,
        check: impl Fn() -> Result<()>,
        timeout: Duration,
    ) -> Result<()> {
        if self.mixing || !self.captured.load(Ordering::Acquire) {
            return Ok(());
        }
        let start = Instant::now();
        while !done()? {
            check()?;
            if start.elapsed() > timeout {
                return Err(CommError::Timeout {
                    op,
                    waited: start.elapsed(),
                    missing: Vec::new(),
                });
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    const LONG: Duration = Duration::from_secs(5);

    /// A device that completes after `looks` looks, counting them.
    fn after(looks: usize, seen: &Cell<usize>) -> impl FnMut() -> Result<bool> + '_ {
        move || {
            seen.set(seen.get() + 1);
            Ok(seen.get() > looks)
        }
    }

    #[test]
    fn nothing_waits_with_mixing_on_or_before_a_capture() {
        let seen = Cell::new(0);
        let on = GraphMixing::new(true);
        on.note_captured();
        on.settle("all_reduce", after(3, &seen), || Ok(()), LONG)
            .unwrap();
        let off = GraphMixing::new(false);
        off.settle("all_reduce", after(3, &seen), || Ok(()), LONG)
            .unwrap();
        assert_eq!(seen.get(), 0, "the device was looked at");
    }

    #[test]
    fn after_a_capture_with_mixing_off_the_host_waits_for_the_queued_work() {
        let seen = Cell::new(0);
        let off = GraphMixing::new(false);
        off.note_captured();
        off.settle("broadcast", after(3, &seen), || Ok(()), LONG)
            .unwrap();
        assert_eq!(seen.get(), 4, "returned before the work completed");
    }

    #[test]
    fn the_wait_ends_with_the_communicator_failure_or_the_timeout_naming_the_operation() {
        let off = GraphMixing::new(false);
        off.note_captured();
        let never = || Ok(false);
        let failed = || {
            Err(CommError::WorkerGone {
                op: "broadcast",
                rank: 1,
            })
        };
        let err = off.settle("broadcast", never, failed, LONG).unwrap_err();
        assert!(
            matches!(err, CommError::WorkerGone { rank: 1, .. }),
            "{err}"
        );
        let short = Duration::from_millis(5);
        let err = off
            .settle("broadcast", never, || Ok(()), short)
            .unwrap_err();
        assert!(
            matches!(
                err,
                CommError::Timeout {
                    op: "broadcast",
                    ..
                }
            ),
            "{err}"
        );
    }
}
