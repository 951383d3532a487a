//! [`MemoryPlan`]: the planned rows of one rank, printed as a table with formulas, as JSON,
//! and checked against a device's memory with the single changes that would make it fit.

use std::fmt::Write;

use serde_json::{json, Map, Value};

use super::{model_states, plan, Bytes, ModelShape, PlanSettings, Row};
use crate::flags::Recompute;

/// The planned memory of one rank.
#[derive(Debug, Clone)]
pub struct MemoryPlan {
    pub model: ModelShape,
    pub settings: PlanSettings,
    pub rows: Vec<Row>,
}

fn gb(bytes: Bytes) -> String {
    format!("{:.2} GB", bytes as f64 / 1e9)
}

impl MemoryPlan {
    pub(super) fn new(model: ModelShape, settings: PlanSettings, rows: Vec<Row>) -> Self {
        Self {
            model,
            settings,
            rows,
        }
    }

    /// Bytes of `category` (0 if absent).
    pub fn bytes(&self, category: &str) -> Bytes {
        self.rows
            .iter()
            .filter(|r| r.category == category)
            .map(|r| r.bytes)
            .sum()
    }

    /// Everything on the device (the host-resident rows of an offloaded optimizer excluded).
    pub fn device_total(&self) -> Bytes {
        self.rows
            .iter()
            .filter(|r| !r.on_host)
            .map(|r| r.bytes)
            .sum()
    }

    /// Everything in host memory (an offloaded optimizer's master weights and states).
    pub fn host_total(&self) -> Bytes {
        self.rows
            .iter()
            .filter(|r| r.on_host)
            .map(|r| r.bytes)
            .sum()
    }

    /// The table: one row per category with its formula, the totals, weft's caveats and the
    /// published formulas for comparison.
    pub fn table(&self) -> String {
        let s = &self.settings;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "memory per rank: Ψ = {} parameters, {} data-parallel ranks (N), ZeRO stage {}, tp {}, pp {}, {}, {}, batch {} per rank{}{}",
            self.model.params(),
            s.world,
            s.zero,
            s.tp,
            s.pp,
            s.precision.name,
            match s.optimizer {
                super::PlannedOptimizer::AdamW => "AdamW",
                super::PlannedOptimizer::Sgd { .. } => "SGD",
            },
            s.batch_size,
            if s.offload_optimizer { ", optimizer offloaded" } else { "" },
            match s.checkpoint_activations {
                Recompute::None => "",
                Recompute::Full => ", activations checkpointed",
                Recompute::Attention => ", attention recomputed",
            },
        );
        let _ = writeln!(out, "{:<18} {:>12}  formula", "category", "bytes");
        for row in &self.rows {
            let _ = writeln!(
                out,
                "{:<18} {:>12}  {}",
                row.category,
                gb(row.bytes),
                row.formula
            );
        }
        let _ = writeln!(
            out,
            "{:<18} {:>12}  on the device",
            "total",
            gb(self.device_total())
        );
        if self.host_total() > 0 {
            let _ = writeln!(
                out,
                "{:<18} {:>12}  in host memory",
                "host",
                gb(self.host_total())
            );
        }
        for note in self.caveats() {
            let _ = writeln!(out, "note: {note}");
        }
        let _ = writeln!(
            out,
            "published model-state formulas (mixed precision, Adam, K = 12) for comparison:"
        );
        let psi = self.model.params();
        for (name, bytes) in
            model_states::published_formulas(psi, s.world as u64, self.model.largest_layer())
        {
            let _ = writeln!(out, "  {name:<70} {:>12}", gb(bytes));
        }
        let _ = writeln!(
            out,
            "  (they count 16-bit gradients; weft accumulates gradients in the master weights' dtype. \
             DeepSpeed's stage-2 estimate keeps the 16-bit parameters and a full 16-bit gradient \
             buffer on every GPU, 4Ψ, and its 16Ψ/N counts fp32 gradient partitions beside the \
             master weights and moments; its stage-3 estimate adds 4 bytes per parameter of the \
             largest layer, gathered with its gradient, and 18Ψ/N for the same partitions plus \
             the 16-bit parameter shards)"
        );
        out
    }

    fn caveats(&self) -> Vec<String> {
        let s = &self.settings;
        let mut notes = Vec::new();
        if s.zero == 3 {
            notes.push("weft's trainers build the model as each rank's shard (one whole parameter at a time at start-up), except with --init-from, which loads the whole model first".into());
        }
        if s.offload_optimizer {
            notes.push("weft's offload is exact: each step waits for the host's update (no one-step-delayed overlap yet)".into());
        }
        if s.precision.name == "bf16-true" {
            notes.push(
                "weft's trainer refuses bf16-true so far (no optimizer rule for bf16 states yet)"
                    .into(),
            );
        }
        notes
    }

    /// One JSON object: the settings, `per_rank_bytes` by category with `total_bytes`, and
    /// the host bytes of an offloaded optimizer.
    pub fn json(&self) -> Value {
        let mut per_rank = Map::new();
        for row in &self.rows {
            per_rank.insert(row.category.into(), json!(row.bytes));
        }
        per_rank.insert("total_bytes".into(), json!(self.device_total()));
        let s = &self.settings;
        json!({
            "params": self.model.params(),
            "world": s.world,
            "zero": s.zero,
            "tp": s.tp,
            "pp": s.pp,
            "precision": s.precision.name,
            "batch_size": s.batch_size,
            "offload_optimizer": s.offload_optimizer,
            "per_rank_bytes": Value::Object(per_rank),
            "total_bytes": self.device_total(),
            "host_bytes": self.host_total(),
            "formulas": self.rows.iter().map(|r| json!({"category": r.category, "formula": r.formula})).collect::<Vec<_>>(),
        })
    }

    /// Whether the plan fits `capacity` bytes of device memory, and if not, which single
    /// change would make it fit.
    pub fn fit(&self, capacity: Bytes) -> String {
        let total = self.device_total();
        if total <= capacity {
            return format!(
                "fits: {} of {} ({:.0} %)",
                gb(total),
                gb(capacity),
                100.0 * total as f64 / capacity as f64
            );
        }
        let s = &self.settings;
        let mut tries: Vec<(String, PlanSettings)> = Vec::new();
        for zero in s.zero + 1..=3 {
            tries.push((format!("--zero {zero}"), PlanSettings { zero, ..s.clone() }));
        }
        if !s.offload_optimizer {
            let zero = s.zero.max(1);
            let name = format!("--zero {zero} --offload-optimizer");
            tries.push((
                name,
                PlanSettings {
                    zero,
                    offload_optimizer: true,
                    ..s.clone()
                },
            ));
        }
        if s.checkpoint_activations != Recompute::Full {
            tries.push((
                "--checkpoint-activations".into(),
                PlanSettings {
                    checkpoint_activations: Recompute::Full,
                    ..s.clone()
                },
            ));
        }
        for tp in [2, 4, 8].into_iter().filter(|&t| t > s.tp) {
            tries.push((format!("--tp {tp}"), PlanSettings { tp, ..s.clone() }));
        }
        let fitting: Vec<String> = tries
            .into_iter()
            .filter_map(|(name, settings)| {
                let total = plan(&self.model, &settings).ok()?.device_total();
                (total <= capacity).then(|| format!("{name} ({})", gb(total)))
            })
            .collect();
        let advice = match fitting.is_empty() {
            true => "no single change fits; combine them or add ranks".to_string(),
            false => format!("one change that fits: {}", fitting.join(", ")),
        };
        format!(
            "does not fit: {} planned, {} available; {advice}",
            gb(total),
            gb(capacity)
        )
    }
}
