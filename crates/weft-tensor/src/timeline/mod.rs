//! A per-rank timeline of a training step — data wait, forward and backward per block, each
//! bucket's all-reduce from launch to completion, optimizer, and counters such as memory by
//! category — written as Chrome trace JSON (open it in Perfetto or `chrome://tracing`).
//!
//! Spans sit on named tracks (`compute`, `comm`, …), one Chrome-trace thread per track, so
//! communication that overlaps backward shows as two bars side by side. A trainer's timeline
//! streams to disk ([`Timeline::stream_to`], flushed every step), so a long run keeps one
//! step's spans in memory; [`chrome::merge_traces`] joins the ranks' files into one trace.
//! Spans opened with [`Timeline::open`] are also NVTX ranges under the `cuda` feature, for
//! Nsight Systems. On a GPU ([`Timeline::time_on_device`]) they are timed on the device, as
//! its stream runs them, not as the host queues the work ([`Timeline::settle`]).

pub mod chrome;
mod device_timer;
mod nvtx_range;

use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use chrome::TraceSink;
use device_timer::{DeviceTimer, Mark};
use nvtx_range::NvtxRange;
/// One recorded span.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub name: String,
    /// Category, e.g. `forward`, `backward`, `allreduce`, `optimizer`, `data`.
    pub category: &'static str,
    /// Track (Chrome-trace thread) the span is drawn on.
    pub track: &'static str,
    /// Microseconds since the timeline's origin.
    pub start_us: f64,
    pub duration_us: f64,
}

impl Span {
    pub fn end_us(&self) -> f64 {
        self.start_us + self.duration_us
    }
}

/// Values of one counter at one moment (a Chrome-trace `C` event: one stacked chart per
/// counter name, one series per value).
#[derive(Debug, Clone, PartialEq)]
pub struct Counter {
    pub name: &'static str,
    pub at_us: f64,
    pub values: Vec<(&'static str, f64)>,
}

/// A thread-safe recorder of spans (and counters) for one rank.
#[derive(Debug)]
pub struct Timeline {
    rank: usize,
    origin: Instant,
    /// The origin as microseconds since the Unix epoch: every rank's trace shares this clock,
    /// so the ranks' files merge into one timeline.
    origin_unix_us: f64,
    spans: Mutex<Vec<Span>>,
    counters: Mutex<Vec<Counter>>,
    sink: Mutex<Option<TraceSink>>,
    /// The GPU stream opened spans are timed on, once set.
    device: OnceLock<DeviceTimer>,
}

impl Timeline {
    /// A timeline kept in memory until written with [`Self::write_chrome_trace`].
    pub fn new(rank: usize) -> Self {
        let origin_unix_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1e6);
        Self {
            rank,
            origin: Instant::now(),
            origin_unix_us,
            spans: Mutex::new(Vec::new()),
            counters: Mutex::new(Vec::new()),
            sink: Mutex::new(None),
            device: OnceLock::new(),
        }
    }

    /// Times the spans opened from now on on `device`'s stream when it is a GPU (with the
    /// `cuda` feature; a stream set earlier stays); whether it does. Their device times are
    /// recorded by [`Self::settle`].
    pub fn time_on_device(&self, device: &candle_core::Device) -> bool {
        if let Some(timer) = DeviceTimer::for_device(device) {
            let _ = self.device.set(timer);
        }
        self.device.get().is_some()
    }

    /// Records the device-timed spans closed so far, once the device has run them (this
    /// waits for it); nothing to do on the CPU.
    pub fn settle(&self) -> io::Result<()> {
        let Some(timer) = self.device.get() else {
            return Ok(());
        };
        for (name, category, track, start, end) in timer.settle()? {
            self.record(name, category, track, start, end);
        }
        Ok(())
    }

    /// Streams the timeline to the Chrome trace `path` (created or truncated) from now on:
    /// each [`Self::flush`] appends what was recorded since the last one and forgets it.
    pub fn stream_to(&self, path: &Path) -> io::Result<()> {
        let sink = TraceSink::create(path, self.rank)?;
        *self.sink.lock().expect("timeline lock") = Some(sink);
        Ok(())
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    fn micros(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.origin).as_secs_f64() * 1e6
    }

    /// Records a span from `start` to `end`.
    pub fn record(
        &self,
        name: impl Into<String>,
        category: &'static str,
        track: &'static str,
        start: Instant,
        end: Instant,
    ) {
        let span = Span {
            name: name.into(),
            category,
            track,
            start_us: self.micros(start),
            duration_us: end.saturating_duration_since(start).as_secs_f64() * 1e6,
        };
        self.spans.lock().expect("timeline lock").push(span);
    }

    /// Starts a span of device work now (and an NVTX range under the `cuda` feature): timed
    /// on the device when the timeline is; [`OpenSpan::close`] records it.
    pub fn open(
        self: &Arc<Self>,
        name: impl Into<String>,
        category: &'static str,
        track: &'static str,
    ) -> OpenSpan {
        let mut span = self.open_on_host(name, category, track);
        span.device_start = self.device.get().and_then(DeviceTimer::mark);
        span
    }

    /// Starts a span of host work now (and an NVTX range), timed on the host.
    pub fn open_on_host(
        self: &Arc<Self>,
        name: impl Into<String>,
        category: &'static str,
        track: &'static str,
    ) -> OpenSpan {
        let name = name.into();
        OpenSpan {
            nvtx: NvtxRange::start(&name),
            timeline: self.clone(),
            name,
            category,
            track,
            start: Instant::now(),
            device_start: None,
        }
    }

    /// Records the values of counter `name` (e.g. memory by category) at `at`.
    pub fn record_counter(
        &self,
        name: &'static str,
        at: Instant,
        values: Vec<(&'static str, f64)>,
    ) {
        let counter = Counter {
            name,
            at_us: self.micros(at),
            values,
        };
        self.counters.lock().expect("timeline lock").push(counter);
    }

    /// The spans held in memory (since the last flush), in recording order.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().expect("timeline lock").clone()
    }

    /// Number of spans held in memory.
    pub fn len(&self) -> usize {
        self.spans.lock().expect("timeline lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The spans recorded after the first `start` ones held (e.g. those of the current step).
    pub fn spans_since(&self, start: usize) -> Vec<Span> {
        let spans = self.spans.lock().expect("timeline lock");
        spans.get(start..).map(<[Span]>::to_vec).unwrap_or_default()
    }

    /// Forgets every span and counter held in memory.
    pub fn clear(&self) {
        self.spans.lock().expect("timeline lock").clear();
        self.counters.lock().expect("timeline lock").clear();
    }

    /// Appends what was recorded since the last flush (device-timed spans settled first) to
    /// the streamed trace and forgets it; nothing to do for a timeline kept in memory.
    pub fn flush(&self) -> io::Result<()> {
        self.settle()?;
        self.flush_first(usize::MAX).map(drop)
    }

    /// Appends the first `len` spans held in memory (fewer if fewer are held) and every counter
    /// to the streamed trace and forgets them, keeping the later spans in order; the number of
    /// spans written (0 when the timeline streams nowhere: it then keeps everything). Unlike
    /// [`Self::flush`] it settles nothing, so it takes no CUDA call: a training loop writes the
    /// last step's spans this way while the device runs the next step.
    pub fn flush_first(&self, len: usize) -> io::Result<usize> {
        let mut sink = self.sink.lock().expect("timeline lock");
        let Some(sink) = sink.as_mut() else {
            return Ok(0);
        };
        let spans: Vec<Span> = {
            let mut held = self.spans.lock().expect("timeline lock");
            let len = len.min(held.len());
            held.drain(..len).collect()
        };
        let counters = std::mem::take(&mut *self.counters.lock().expect("timeline lock"));
        sink.append(&spans, &counters, self.origin_unix_us)?;
        Ok(spans.len())
    }

    /// Flushes and closes the streamed trace, leaving it a complete JSON document.
    pub fn finish(&self) -> io::Result<()> {
        self.flush()?;
        match self.sink.lock().expect("timeline lock").take() {
            Some(sink) => sink.finish(),
            None => Ok(()),
        }
    }

    /// The spans held in memory as a Chrome trace (`traceEvents` of complete `X` events,
    /// counters as `C` events; process = rank; timestamps in microseconds since the epoch).
    pub fn to_chrome_trace(&self) -> serde_json::Value {
        let spans = self.spans();
        let counters = self.counters.lock().expect("timeline lock").clone();
        let mut tracks = Vec::new();
        let mut events = vec![chrome::process_name(self.rank)];
        events.extend(chrome::events(
            self.rank,
            self.origin_unix_us,
            &spans,
            &counters,
            &mut tracks,
        ));
        serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ms" })
    }

    /// Writes the Chrome trace of the spans held in memory to `path` (atomically).
    pub fn write_chrome_trace(&self, path: &Path) -> io::Result<()> {
        let tmp = crate::private_files::temporary_sibling(path);
        std::fs::write(&tmp, serde_json::to_vec(&self.to_chrome_trace())?)?;
        std::fs::rename(tmp, path)
    }
}

/// A span started by [`Timeline::open`]; [`Self::close`] records it. Dropped unclosed (an
/// error on the way), it records nothing and only ends its NVTX range.
#[derive(Debug)]
pub struct OpenSpan {
    timeline: Arc<Timeline>,
    name: String,
    category: &'static str,
    track: &'static str,
    start: Instant,
    /// Its start on the device, when timed there.
    device_start: Option<Mark>,
    nvtx: NvtxRange,
}

impl OpenSpan {
    /// Records the span from its start to now (on the device: kept until
    /// [`Timeline::settle`]).
    pub fn close(self) {
        let end = Instant::now();
        self.nvtx.end();
        let timer = self.timeline.device.get();
        if let (Some(start), Some(timer)) = (self.device_start, timer) {
            if let Some(device_end) = timer.mark() {
                timer.push((self.name, self.category, self.track), start, device_end);
                return;
            }
        }
        self.timeline
            .record(self.name, self.category, self.track, self.start, end);
    }
}

/// The part of `comm` spans' total time that lies under the union of `compute` spans, as a
/// fraction of the total communication time (1.0 when there was no communication).
pub fn hidden_fraction(comm: &[Span], compute: &[Span]) -> f64 {
    let total: f64 = comm.iter().map(|s| s.duration_us).sum();
    if total == 0.0 {
        return 1.0;
    }
    let hidden: f64 = comm
        .iter()
        .map(|c| {
            compute
                .iter()
                .map(|b| (c.end_us().min(b.end_us()) - c.start_us.max(b.start_us)).max(0.0))
                .sum::<f64>()
        })
        .sum();
    (hidden / total).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start: f64, dur: f64, track: &'static str) -> Span {
        Span {
            name: "s".into(),
            category: "c",
            track,
            start_us: start,
            duration_us: dur,
        }
    }

    #[test]
    fn hidden_fraction_counts_overlap_with_compute() {
        let compute = [span(0.0, 10.0, "compute"), span(10.0, 10.0, "compute")];
        // 5 us of 10 under compute, then 10 us fully after it: 5 of 20 hidden.
        let comm = [span(15.0, 10.0, "comm"), span(30.0, 10.0, "comm")];
        assert!((hidden_fraction(&comm, &compute) - 0.25).abs() < 1e-12);
        assert_eq!(hidden_fraction(&[], &compute), 1.0);
    }

    #[test]
    fn chrome_trace_names_tracks_and_rank() {
        let timeline = Timeline::new(3);
        let t0 = Instant::now();
        timeline.record(
            "layer1.0",
            "backward",
            "compute",
            t0,
            t0 + std::time::Duration::from_millis(2),
        );
        timeline.record(
            "bucket 0",
            "allreduce",
            "comm",
            t0,
            t0 + std::time::Duration::from_millis(1),
        );
        let trace = timeline.to_chrome_trace();
        let events = trace["traceEvents"].as_array().unwrap();
        let spans: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(spans.len(), 2);
        assert!(
            events.iter().all(|e| e["ph"] != "C"),
            "no counters recorded yet"
        );
        assert_eq!(spans[0]["pid"], 3);
        assert_ne!(spans[0]["tid"], spans[1]["tid"]);
        assert!((spans[0]["dur"].as_f64().unwrap() - 2000.0).abs() < 1.0);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trace-rank3.json");
        timeline.write_chrome_trace(&path).unwrap();
        let read: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        assert_eq!(read, trace);
    }

    #[test]
    fn counters_become_chrome_counter_events() {
        let timeline = Timeline::new(1);
        let at = Instant::now();
        timeline.record_counter(
            "memory MiB",
            at,
            vec![("parameters", 4.0), ("activations", 9.5)],
        );
        let trace = timeline.to_chrome_trace();
        let counters: Vec<_> = trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "C")
            .cloned()
            .collect();
        assert_eq!(counters.len(), 1);
        assert_eq!(counters[0]["name"], "memory MiB");
        assert_eq!(counters[0]["pid"], 1);
        assert_eq!(counters[0]["args"]["activations"], 9.5);
        timeline.clear();
        assert!(timeline.to_chrome_trace()["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["ph"] != "C"));
    }
}
