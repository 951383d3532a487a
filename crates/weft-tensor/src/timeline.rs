//! A per-rank timeline of a training step — data wait, forward and backward per block, each
//! bucket's all-reduce from launch to completion, optimizer, and counters such as memory by
//! category — written as Chrome trace JSON (open it in Perfetto or `chrome://tracing`).
//!
//! Spans sit on named tracks (`compute`, `comm`, …), one Chrome-trace thread per track, so
//! communication that overlaps backward shows as two bars side by side.

use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

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
    spans: Mutex<Vec<Span>>,
    counters: Mutex<Vec<Counter>>,
}

impl Timeline {
    pub fn new(rank: usize) -> Self {
        Self {
            rank,
            origin: Instant::now(),
            spans: Mutex::new(Vec::new()),
            counters: Mutex::new(Vec::new()),
        }
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

    /// All spans recorded so far, in recording order.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().expect("timeline lock").clone()
    }

    /// Number of spans recorded so far.
    pub fn len(&self) -> usize {
        self.spans.lock().expect("timeline lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The spans recorded after the first `start` ones (e.g. those of the current step).
    pub fn spans_since(&self, start: usize) -> Vec<Span> {
        let spans = self.spans.lock().expect("timeline lock");
        spans.get(start..).map(<[Span]>::to_vec).unwrap_or_default()
    }

    /// Forgets every span and counter (e.g. after writing a step out).
    pub fn clear(&self) {
        self.spans.lock().expect("timeline lock").clear();
        self.counters.lock().expect("timeline lock").clear();
    }

    /// The spans as a Chrome trace (`traceEvents` of complete `X` events, counters as `C`
    /// events; process = rank).
    pub fn to_chrome_trace(&self) -> serde_json::Value {
        let spans = self.spans();
        let mut tracks: Vec<&'static str> = Vec::new();
        for s in &spans {
            if !tracks.contains(&s.track) {
                tracks.push(s.track);
            }
        }
        let tid = |track: &str| tracks.iter().position(|t| *t == track).unwrap_or(0);
        let mut events: Vec<serde_json::Value> = tracks
            .iter()
            .enumerate()
            .map(|(i, t)| serde_json::json!({"ph": "M", "name": "thread_name", "pid": self.rank, "tid": i, "args": {"name": t}}))
            .collect();
        events.push(serde_json::json!({"ph": "M", "name": "process_name", "pid": self.rank, "args": {"name": format!("rank {}", self.rank)}}));
        events.extend(spans.iter().map(|s| {
            serde_json::json!({
                "ph": "X", "name": s.name, "cat": s.category, "pid": self.rank, "tid": tid(s.track),
                "ts": s.start_us, "dur": s.duration_us,
            })
        }));
        let counters = self.counters.lock().expect("timeline lock").clone();
        events.extend(counters.iter().map(|c| {
            let args: serde_json::Map<String, serde_json::Value> =
                c.values.iter().map(|(k, v)| (k.to_string(), serde_json::json!(v))).collect();
            serde_json::json!({"ph": "C", "name": c.name, "pid": self.rank, "ts": c.at_us, "args": args})
        }));
        serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ms" })
    }

    /// Writes the Chrome trace to `path` (atomically).
    pub fn write_chrome_trace(&self, path: &Path) -> std::io::Result<()> {
        let tmp = crate::state_dict::temporary_sibling(path);
        std::fs::write(&tmp, serde_json::to_vec(&self.to_chrome_trace())?)?;
        std::fs::rename(tmp, path)
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
