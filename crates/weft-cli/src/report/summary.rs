//! The report's table: time per phase and rank (mean over the traced steps after the first),
//! how much communication was hidden under compute, and rank 0's memory peak per category.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::run_data::{RunData, MEMORY_CATEGORIES};

const MIB: f64 = (1u64 << 20) as f64;

/// Mean milliseconds per step of each category on each rank, over the steps where it ran (a
/// step replayed as a CUDA graph records one `graph` span instead of its blocks), and of the
/// whole step; the first traced step (warm-up) is left out when there are others.
pub fn phase_times(data: &RunData) -> BTreeMap<String, Vec<f64>> {
    let ranks = data.ranks();
    let mut steps = data.traced_steps();
    if steps.len() > 1 {
        steps.remove(0);
    }
    let mut table: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    // Steps in which each category ran, per rank.
    let mut counts: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for &step in &steps {
        let (spans, _) = data.spans_of_step(step);
        let mut seen: Vec<(String, usize)> = Vec::new();
        for s in spans {
            let column = ranks.iter().position(|&r| r == s.rank).unwrap_or(0);
            table
                .entry(s.category.clone())
                .or_insert_with(|| vec![0.0; ranks.len()])[column] += s.duration_us;
            if !seen.contains(&(s.category.clone(), column)) {
                seen.push((s.category.clone(), column));
                counts
                    .entry(s.category.clone())
                    .or_insert_with(|| vec![0.0; ranks.len()])[column] += 1.0;
            }
        }
        for s in data.spans.iter().filter(|s| s.category == "step") {
            if s.name == format!("step {step}") {
                let column = ranks.iter().position(|&r| r == s.rank).unwrap_or(0);
                table
                    .entry("step".into())
                    .or_insert_with(|| vec![0.0; ranks.len()])[column] += s.duration_us;
                counts
                    .entry("step".into())
                    .or_insert_with(|| vec![0.0; ranks.len()])[column] += 1.0;
            }
        }
    }
    for (category, row) in table.iter_mut() {
        for (v, n) in row.iter_mut().zip(&counts[category]) {
            *v /= n.max(1.0) * 1e3;
        }
    }
    table
}

/// The summary as text.
pub fn summary(data: &RunData) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "run {}", data.folder.display());
    if let (Some(first), Some(last)) = (data.steps.first(), data.steps.last()) {
        let _ = writeln!(
            out,
            "steps {}..={}: loss {:.4} -> {:.4}",
            first.step, last.step, first.loss, last.loss
        );
    }
    if let Some(e) = data.epochs.last() {
        let acc = e
            .val_acc
            .map(|a| format!(", val acc {:.2}%", 100.0 * a))
            .unwrap_or_default();
        let _ = writeln!(out, "epoch {}: val loss {:.4}{acc}", e.epoch, e.val_loss);
    }
    let throughput: Vec<f64> = data
        .steps
        .iter()
        .skip(1)
        .filter_map(|s| s.throughput())
        .collect();
    if !throughput.is_empty() {
        let mean = throughput.iter().sum::<f64>() / throughput.len() as f64;
        let _ = writeln!(
            out,
            "throughput: {mean:.1} {} (mean after step 0)",
            data.throughput_unit
        );
    }

    let ranks = data.ranks();
    let times = phase_times(data);
    if !times.is_empty() {
        let _ = write!(
            out,
            "\ntime per step (ms, mean over the steps where it ran)"
        );
        for r in &ranks {
            let _ = write!(out, " {:>10}", format!("rank {r}"));
        }
        out.push('\n');
        for (phase, row) in &times {
            let _ = write!(out, "{phase:<18}");
            for v in row {
                let _ = write!(out, " {v:>10.2}");
            }
            out.push('\n');
        }
    }
    let hidden: Vec<f64> = data.steps.iter().filter_map(|s| s.comm_hidden).collect();
    if !hidden.is_empty() {
        let mean = hidden.iter().sum::<f64>() / hidden.len() as f64;
        let _ = writeln!(
            out,
            "communication hidden under compute: {:.1}%",
            100.0 * mean
        );
    }

    if !data.memory.is_empty() {
        let _ = writeln!(out, "\nmemory peak, rank 0 (MiB)");
        for (i, category) in MEMORY_CATEGORIES.iter().enumerate() {
            let peak = data
                .memory
                .iter()
                .map(|m| m.categories[i].1)
                .fold(0.0, f64::max);
            let _ = writeln!(out, "{category:<22} {:>10.2}", peak / MIB);
        }
        let total = data
            .memory
            .iter()
            .map(|m| m.categories.iter().map(|c| c.1).sum::<f64>())
            .fold(0.0, f64::max);
        let _ = writeln!(out, "{:<22} {:>10.2}", "total (at once)", total / MIB);
        if let Some(device) = data
            .memory
            .iter()
            .filter_map(|m| m.device_in_use)
            .reduce(f64::max)
        {
            let _ = writeln!(out, "{:<22} {:>10.2}", "device in use", device / MIB);
        }
    }
    out
}
