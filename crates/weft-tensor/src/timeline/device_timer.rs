//! Spans timed on the GPU: with the `cuda` feature, a timeline set to a CUDA device
//! ([`super::Timeline::time_on_device`]) brackets each span opened on it with a pair of timing
//! events on the device's stream (none while the stream is captured into a CUDA graph: such
//! spans keep host time). [`DeviceTimer::settle`] puts those the device has run on the host's
//! clock, without waiting for the device: against an anchor — an event the host waited for,
//! and the moment the wait returned — renewed every hundred settles so that the two
//! clocks cannot drift apart. Without the feature no device is timed.

use std::time::Instant;

/// A span whose device times are settled: name, category, track, start, end.
pub(super) type Settled = (String, &'static str, &'static str, Instant, Instant);

#[cfg(feature = "cuda")]
pub(super) use on_cuda::{DeviceTimer, Mark};

#[cfg(not(feature = "cuda"))]
pub(super) use without_cuda::{DeviceTimer, Mark};

#[cfg(feature = "cuda")]
mod on_cuda {
    use std::collections::VecDeque;
    use std::io;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use candle_core::Device;
    use cudarc::driver::sys::{CUevent_flags, CUstreamCaptureStatus};
    use cudarc::driver::{CudaEvent, CudaStream};

    use super::Settled;

    /// At most this many spans wait to be settled; older ones are dropped.
    const MAX_PENDING: usize = 16384;

    /// Settles between two anchors (a host wait each): about one a hundred steps.
    const ANCHOR_SETTLES: usize = 100;

    /// A timing event recorded where a span starts.
    #[derive(Debug)]
    pub(in crate::timeline) struct Mark(CudaEvent);

    #[derive(Debug)]
    struct Pending {
        name: String,
        category: &'static str,
        track: &'static str,
        start: CudaEvent,
        end: CudaEvent,
    }

    /// An event the host waited for, when the wait returned, and the settles since.
    #[derive(Debug)]
    struct Anchor {
        event: CudaEvent,
        at: Instant,
        settles: usize,
    }

    /// The stream spans are timed on and the spans closed but not yet settled.
    #[derive(Debug)]
    pub(in crate::timeline) struct DeviceTimer {
        stream: Arc<CudaStream>,
        pending: Mutex<VecDeque<Pending>>,
        anchor: Mutex<Option<Anchor>>,
    }

    impl DeviceTimer {
        /// A timer on `device`'s stream; none for a device other than a GPU.
        pub(in crate::timeline) fn for_device(device: &Device) -> Option<Self> {
            let stream = device.as_cuda_device().ok()?.cuda_stream();
            Some(Self {
                stream,
                pending: Mutex::new(VecDeque::new()),
                anchor: Mutex::new(None),
            })
        }

        /// A timing event now on the stream; none while it is captured (or on an error: the
        /// span then keeps host time).
        pub(in crate::timeline) fn mark(&self) -> Option<Mark> {
            let status = self.stream.capture_status().ok()?;
            if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                return None;
            }
            let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
            self.stream.record_event(flags).ok().map(Mark)
        }

        /// Keeps a closed span until [`Self::settle`].
        pub(in crate::timeline) fn push(
            &self,
            (name, category, track): (String, &'static str, &'static str),
            Mark(start): Mark,
            Mark(end): Mark,
        ) {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            if pending.len() == MAX_PENDING {
                pending.pop_front();
            }
            pending.push_back(Pending {
                name,
                category,
                track,
                start,
                end,
            });
        }

        /// The spans closed since the last call that the device has run, on the host's clock
        /// (the others stay for the next call).
        pub(in crate::timeline) fn settle(&self) -> io::Result<Vec<Settled>> {
            let done: Vec<Pending> = {
                let mut queue = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                let (done, running): (Vec<_>, Vec<_>) =
                    queue.drain(..).partition(|p| p.end.is_complete());
                *queue = running.into();
                done
            };
            if done.is_empty() {
                return Ok(Vec::new());
            }
            let fail = |e: cudarc::driver::DriverError| io::Error::other(format!("{e:?}"));
            let mut anchor = self.anchor.lock().unwrap_or_else(|p| p.into_inner());
            if anchor.as_ref().is_none_or(|a| a.settles >= ANCHOR_SETTLES) {
                let event = self
                    .stream
                    .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(fail)?;
                event.synchronize().map_err(fail)?;
                let at = Instant::now();
                *anchor = Some(Anchor {
                    event,
                    at,
                    settles: 0,
                });
            }
            let anchor = anchor.as_mut().expect("set above");
            anchor.settles += 1;
            let on_host = |event: &CudaEvent| -> io::Result<Instant> {
                let ms = f64::from(anchor.event.elapsed_ms(event).map_err(fail)?);
                let offset = Duration::from_secs_f64(ms.abs() / 1e3);
                Ok(match ms < 0.0 {
                    true => anchor.at.checked_sub(offset).unwrap_or(anchor.at),
                    false => anchor.at + offset,
                })
            };
            done.into_iter()
                .map(|p| {
                    let (start, end) = (on_host(&p.start)?, on_host(&p.end)?);
                    Ok((p.name, p.category, p.track, start, end))
                })
                .collect()
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod without_cuda {
    use std::io;

    use candle_core::Device;

    use super::Settled;

    /// Never made: no device is timed without the `cuda` feature.
    #[derive(Debug)]
    pub(in crate::timeline) struct Mark;

    #[derive(Debug)]
    pub(in crate::timeline) struct DeviceTimer;

    impl DeviceTimer {
        pub(in crate::timeline) fn for_device(_device: &Device) -> Option<Self> {
            None
        }

        pub(in crate::timeline) fn mark(&self) -> Option<Mark> {
            None
        }

        pub(in crate::timeline) fn push(
            &self,
            _span: (String, &'static str, &'static str),
            _start: Mark,
            _end: Mark,
        ) {
        }

        pub(in crate::timeline) fn settle(&self) -> io::Result<Vec<Settled>> {
            Ok(Vec::new())
        }
    }
}
