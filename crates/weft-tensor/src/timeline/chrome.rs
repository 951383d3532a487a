//! Chrome trace events: the conversion of spans and counters, a streamed per-rank trace file,
//! and the merge of the ranks' files into one.
//!
//! A streamed file uses the Chrome trace format's JSON Array form — `[` then one event per
//! line — which Perfetto and `chrome://tracing` open even when it was cut short (a run that
//! died mid-step), so a crash never loses the steps already flushed.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::{Counter, Span};

/// The metadata event naming the process of rank `rank`.
pub fn process_name(rank: usize) -> Value {
    json!({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": format!("rank {rank}")}})
}

/// Events of `spans` and `counters` of rank `rank`, timestamps shifted by `origin_unix_us`.
/// `tracks` lists the tracks already named (a thread-name event is emitted for each new one,
/// and a track keeps its thread id across calls).
pub fn events(
    rank: usize,
    origin_unix_us: f64,
    spans: &[Span],
    counters: &[Counter],
    tracks: &mut Vec<&'static str>,
) -> Vec<Value> {
    let mut out = Vec::with_capacity(spans.len() + counters.len());
    for s in spans {
        let tid = match tracks.iter().position(|t| *t == s.track) {
            Some(tid) => tid,
            None => {
                tracks.push(s.track);
                let tid = tracks.len() - 1;
                out.push(json!({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": s.track}}));
                tid
            }
        };
        out.push(json!({
            "ph": "X", "name": s.name, "cat": s.category, "pid": rank, "tid": tid,
            "ts": origin_unix_us + s.start_us, "dur": s.duration_us,
        }));
    }
    out.extend(counters.iter().map(|c| {
        let args: serde_json::Map<String, Value> =
            c.values.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
        json!({"ph": "C", "name": c.name, "pid": rank, "ts": origin_unix_us + c.at_us, "args": args})
    }));
    out
}

/// A per-rank trace file written as the run goes.
#[derive(Debug)]
pub struct TraceSink {
    out: BufWriter<File>,
    rank: usize,
    tracks: Vec<&'static str>,
}

impl TraceSink {
    /// Creates (or truncates) `path` and writes the array's opening and the process name.
    pub fn create(path: &Path, rank: usize) -> io::Result<Self> {
        let mut out = BufWriter::new(File::create(path)?);
        writeln!(out, "[")?;
        serde_json::to_writer(&mut out, &process_name(rank))?;
        out.flush()?;
        Ok(Self {
            out,
            rank,
            tracks: Vec::new(),
        })
    }

    /// Appends the events of `spans` and `counters` and flushes them to the file.
    pub fn append(
        &mut self,
        spans: &[Span],
        counters: &[Counter],
        origin_unix_us: f64,
    ) -> io::Result<()> {
        for event in events(self.rank, origin_unix_us, spans, counters, &mut self.tracks) {
            writeln!(self.out, ",")?;
            serde_json::to_writer(&mut self.out, &event)?;
        }
        self.out.flush()
    }

    /// Closes the array, so the file is a complete JSON document.
    pub fn finish(mut self) -> io::Result<()> {
        writeln!(self.out, "\n]")?;
        self.out.flush()?;
        self.out.get_ref().sync_all()
    }
}

/// The events of a Chrome trace file: an object with `traceEvents`, or the JSON Array form,
/// closed or cut short after any complete event.
pub fn read_events(path: &Path) -> io::Result<Vec<Value>> {
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let text = std::fs::read_to_string(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let trimmed = text.trim_end();
    let value: Value = if trimmed.starts_with('[') && !trimmed.ends_with(']') {
        let complete = trimmed.trim_end_matches(',');
        serde_json::from_str(&format!("{complete}]"))
    } else {
        serde_json::from_str(trimmed)
    }
    .map_err(|e| invalid(format!("{}: not a Chrome trace: {e}", path.display())))?;
    match value {
        Value::Array(events) => Ok(events),
        Value::Object(mut object) => match object.remove("traceEvents") {
            Some(Value::Array(events)) => Ok(events),
            _ => Err(invalid(format!(
                "{}: field traceEvents: missing or not an array",
                path.display()
            ))),
        },
        _ => Err(invalid(format!(
            "{}: not a Chrome trace (neither an array nor an object)",
            path.display()
        ))),
    }
}

/// Writes one Chrome trace joining `inputs` (the ranks' traces, one process each) to `out`,
/// atomically; returns the number of events.
pub fn merge_traces(inputs: &[PathBuf], out: &Path) -> io::Result<usize> {
    let mut events = Vec::new();
    for input in inputs {
        events.extend(read_events(input)?);
    }
    let count = events.len();
    let tmp = crate::private_files::temporary_sibling(out);
    let mut writer = BufWriter::new(File::create(&tmp)?);
    serde_json::to_writer(
        &mut writer,
        &json!({"traceEvents": events, "displayTimeUnit": "ms"}),
    )?;
    writer.flush()?;
    drop(writer);
    std::fs::rename(tmp, out)?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::timeline::Timeline;

    fn spans_of(events: &[Value]) -> Vec<&Value> {
        events.iter().filter(|e| e["ph"] == "X").collect()
    }

    #[test]
    fn a_streamed_trace_holds_every_flushed_step_and_reads_back_cut_short() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trace-rank1.json");
        let timeline = Arc::new(Timeline::new(1));
        timeline.stream_to(&path).unwrap();
        let t0 = Instant::now();
        for step in 0..3 {
            timeline.record(format!("step {step}"), "forward", "compute", t0, t0);
            timeline.record("bucket", "allreduce", "comm", t0, t0);
            timeline.flush().unwrap();
            assert!(timeline.is_empty(), "a flush forgets what it wrote");
        }
        // Not finished: the file is cut short after the last flushed event, as after a crash.
        let events = read_events(&path).unwrap();
        assert_eq!(spans_of(&events).len(), 6);
        let threads: Vec<_> = events
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .collect();
        assert_eq!(threads.len(), 2, "each track is named once: {threads:?}");
        timeline.open("update", "optimizer", "compute").close();
        timeline.finish().unwrap();
        let whole: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let whole = whole.as_array().unwrap();
        assert_eq!(spans_of(whole).len(), 7);
        assert!(whole.iter().all(|e| e["pid"] == 1));
    }

    #[test]
    fn flushing_the_first_spans_keeps_the_later_ones_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trace-rank0.json");
        let timeline = Timeline::new(0);
        let t0 = Instant::now();
        timeline.record("before", "forward", "compute", t0, t0);
        // Streaming nowhere, nothing is written or forgotten.
        assert_eq!(timeline.flush_first(1).unwrap(), 0);
        assert_eq!(timeline.len(), 1);
        timeline.stream_to(&path).unwrap();
        for name in ["a", "b"] {
            timeline.record(name, "allreduce", "comm", t0, t0);
        }
        assert_eq!(timeline.flush_first(2).unwrap(), 2);
        let kept: Vec<_> = timeline.spans().into_iter().map(|s| s.name).collect();
        assert_eq!(kept, ["b"]);
        assert_eq!(timeline.flush_first(5).unwrap(), 1);
        assert!(timeline.is_empty());
        timeline.finish().unwrap();
        let whole: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let names: Vec<_> = spans_of(whole.as_array().unwrap())
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(names, ["before", "a", "b"]);
    }

    #[test]
    fn merged_traces_keep_one_process_per_rank_on_one_clock() {
        let dir = tempfile::tempdir().unwrap();
        let paths: Vec<PathBuf> = (0..2)
            .map(|r| dir.path().join(format!("trace-rank{r}.json")))
            .collect();
        let t0 = Instant::now();
        for (rank, path) in paths.iter().enumerate() {
            let timeline = Timeline::new(rank);
            timeline.stream_to(path).unwrap();
            let start = t0 + Duration::from_millis(10 * rank as u64);
            timeline.record("forward", "forward", "compute", start, start);
            timeline.finish().unwrap();
        }
        let out = dir.path().join("trace.json");
        assert_eq!(merge_traces(&paths, &out).unwrap(), 2 * 3);
        let merged = read_events(&out).unwrap();
        let spans = spans_of(&merged);
        assert_eq!(spans.len(), 2);
        assert_eq!(
            (spans[0]["pid"].clone(), spans[1]["pid"].clone()),
            (json!(0), json!(1))
        );
        // Rank 1 started its span 10 ms after rank 0 on the shared wall clock (each timeline
        // took its own origin, microseconds apart).
        let gap = spans[1]["ts"].as_f64().unwrap() - spans[0]["ts"].as_f64().unwrap();
        assert!((gap - 10_000.0).abs() < 2_000.0, "gap {gap} us");
    }

    #[test]
    fn a_file_that_is_no_trace_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trace-rank0.json");
        std::fs::write(&path, "{\"events\": []}").unwrap();
        let err = read_events(&path).unwrap_err().to_string();
        assert!(
            err.contains("trace-rank0.json") && err.contains("traceEvents"),
            "{err}"
        );
        std::fs::write(&path, "[{\"ph\": \"X\"}, {\"ph\":").unwrap();
        let err = read_events(&path).unwrap_err().to_string();
        assert!(err.contains("not a Chrome trace"), "{err}");
    }
}
