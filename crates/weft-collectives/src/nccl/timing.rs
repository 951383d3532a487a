//! Timing the operations ordered on the device, for a timeline: when timing is on, each one is
//! bracketed by a pair of timing events on the communication stream (none while the stream is
//! captured into a CUDA graph). Once the device has finished them, [`OpTimer::take`] puts them
//! on the host's clock: it records one more event, waits for it, and places every pair that
//! many milliseconds before the moment the wait returned.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{CUevent_flags, CUstreamCaptureStatus};
use cudarc::driver::{CudaEvent, CudaStream, DriverError};

use crate::device::DeviceSpan;

/// At most this many timed operations wait to be taken; older ones are dropped.
const MAX_PENDING: usize = 4096;

/// An operation's timing events, issued but maybe not yet run.
struct Pending {
    op: &'static str,
    bytes: usize,
    start: CudaEvent,
    end: CudaEvent,
}

/// The ordered operations' timing events, off until [`OpTimer::set`] turns them on.
#[derive(Default)]
pub(crate) struct OpTimer {
    on: AtomicBool,
    pending: Mutex<VecDeque<Pending>>,
}

/// An operation's start event, to be closed by [`OpTimer::end`] once it is queued.
pub(crate) struct Started(Option<CudaEvent>);

fn timing_event(stream: &CudaStream) -> Result<CudaEvent, DriverError> {
    stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
}

impl OpTimer {
    pub(crate) fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// Marks the start of an operation about to be queued on `stream`, when timing is on and
    /// the stream is not being captured.
    pub(crate) fn start(&self, stream: &CudaStream) -> Result<Started, DriverError> {
        if !self.on.load(Ordering::Relaxed) {
            return Ok(Started(None));
        }
        if stream.capture_status()? != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Ok(Started(None));
        }
        Ok(Started(Some(timing_event(stream)?)))
    }

    /// Marks the end of operation `op` over `bytes`, just queued on `stream`.
    pub(crate) fn end(
        &self,
        started: Started,
        (op, bytes): (&'static str, usize),
        stream: &CudaStream,
    ) -> Result<(), DriverError> {
        let Started(Some(start)) = started else {
            return Ok(());
        };
        let end = timing_event(stream)?;
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if pending.len() == MAX_PENDING {
            pending.pop_front();
        }
        pending.push_back(Pending {
            op,
            bytes,
            start,
            end,
        });
        Ok(())
    }

    /// The operations timed since the last call, in issue order, on the host's clock. The
    /// device must have finished them (this waits for each, which is then immediate).
    pub(crate) fn take(&self, stream: &CudaStream) -> Result<Vec<DeviceSpan>, DriverError> {
        let pending: Vec<Pending> = {
            let mut queue = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            queue.drain(..).collect()
        };
        if pending.is_empty() {
            return Ok(Vec::new());
        }
        let mark = timing_event(stream)?;
        mark.synchronize()?;
        let now = Instant::now();
        let before_now = |event: &CudaEvent| -> Result<Instant, DriverError> {
            let ms = f64::from(event.elapsed_ms(&mark)?.max(0.0));
            Ok(now
                .checked_sub(Duration::from_secs_f64(ms / 1e3))
                .unwrap_or(now))
        };
        pending
            .iter()
            .map(|p| {
                Ok(DeviceSpan {
                    op: p.op,
                    bytes: p.bytes,
                    start: before_now(&p.start)?,
                    end: before_now(&p.end)?,
                })
            })
            .collect()
    }
}
