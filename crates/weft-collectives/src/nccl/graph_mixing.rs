//! NCCL with graph mixing turned off (`NCCL_GRAPH_MIXING_SUPPORT=0`, which `weft-run` sets).
//!
//! By default NCCL captures a cross-stream serialisation around every collective, so that
//! graph-captured and eager operations of one communicator may be outstanding together.
//! Without it a ResNet-50 DDP step replayed from a CUDA graph runs about 2 % faster on two and
//! four H100s (BENCHMARKS.md, twenty-third session). NCCL then leaves one rule to the program:
//! no operation may be issued outside a capture while a graph launch holding the
//! communicator's operations may still run, and stream order is not enough.
//!
//! [`GraphMixing::settle`] keeps that rule. Once an operation of the communicator has been
//! captured, every operation issued outside a capture first waits, on the host, for the
//! compute-stream work queued before it, graph launches included. The wait is watched: a
//! failed communicator or the timeout ends it with an error.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cudarc::driver::CudaEvent;

use super::engine::{driver, Health};
use crate::error::{CommError, Result};

/// Whether NCCL mixes graph-captured and eager operations, and whether this communicator has
/// had an operation captured.
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
    /// captured, waits until `ready` (recorded on the compute stream when `op` was started)
    /// has completed, so that no graph launch queued before `op` still runs when NCCL is
    /// called.
    pub fn settle(
        &self,
        op: &'static str,
        ready: &CudaEvent,
        (health, timeout, rank): (&Health, Duration, usize),
    ) -> Result<()> {
        if self.mixing || !self.captured.load(Ordering::Acquire) {
            return Ok(());
        }
        let start = Instant::now();
        while !ready.try_is_complete().map_err(|e| driver(op, rank, e))? {
            health.check(op)?;
            if start.elapsed() > timeout {
                return Err(CommError::Timeout {
                    op,
                    waited: start.elapsed(),
                    missing: Vec::new(),
                });
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        Ok(())
    }
}
