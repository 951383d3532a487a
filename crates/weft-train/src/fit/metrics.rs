//! The lines of a run's `metrics.jsonl`, one schema written by the training loop and read by
//! the report: a step line per optimizer step and an epoch line per epoch, each carrying its
//! `"type"` (`"step"`, `"epoch"`) and `"time"` (Unix seconds when it was written). Lines of
//! runs from before `"type"` existed are told apart by their keys.

use serde::{Deserialize, Serialize};

/// A pipeline step's measurements on every stage (gathered to every rank).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PipelineReport {
    /// Per stage, the part of the schedule's wall time it computed nothing.
    pub bubble: Vec<f64>,
    /// `(P − 1) / (M + P − 1)`.
    pub bubble_theory: f64,
    /// Per stage, the most micro-batches whose activations it held at once.
    pub peak_micro_batches: Vec<usize>,
    /// Per stage, the most bytes of activations it held at once for its backwards.
    pub peak_activation_bytes: Vec<usize>,
}

/// One optimizer step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepLine {
    pub step: usize,
    pub epoch: usize,
    /// Mean loss of the step's global batch, before the update.
    pub loss: f64,
    pub lr: f64,
    /// Images (of an image task) over the loop's period: from the end of the previous step to
    /// the end of this one (the host's work between steps included), so that the rates add up
    /// to the wall time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images_per_sec: Option<f64>,
    /// Tokens (of a language-model task) over the same period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_sec: Option<f64>,
    /// Share of the step's gradient all-reduce time hidden under backward (data parallel only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm_hidden: Option<f64>,
    /// Global gradient norm before clipping (with `--clip-grad-norm` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_norm: Option<f64>,
    /// The loss scale after the step (with a loss scaler: `--precision fp16-mixed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f64>,
    /// With a pipeline: each stage's measured bubble and peak of micro-batches in flight.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<PipelineReport>,
}

impl StepLine {
    /// Images or tokens per second, whichever the task counts.
    pub fn throughput(&self) -> Option<f64> {
        self.images_per_sec.or(self.tokens_per_sec)
    }
}

/// One epoch; accuracies are fractions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochLine {
    pub epoch: usize,
    pub train_loss: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_acc: Option<f64>,
    pub val_loss: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_acc: Option<f64>,
    #[serde(default)]
    pub seconds: f64,
    /// Steps the loss scaler skipped in this epoch (with a loss scaler only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped_steps: Option<usize>,
    /// Training samples replaced for being undecodable or oversized, over all ranks (with
    /// `--skip-bad-samples` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped_samples: Option<usize>,
}

/// A line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Line {
    Step(StepLine),
    Epoch(EpochLine),
}

/// A line as written: its fields, its `"type"` and its `"time"`.
#[derive(Serialize)]
struct Timed<'a> {
    #[serde(flatten)]
    line: &'a Line,
    time: f64,
}

impl Line {
    /// The line's JSON, stamped with the time now.
    pub fn to_json(&self) -> serde_json::Result<String> {
        let time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        serde_json::to_string(&Timed { line: self, time })
    }

    /// Reads a line: by its `"type"`, or (a line written before `"type"` existed) a step line
    /// if it has a `"step"`, an epoch line otherwise.
    pub fn parse(text: &str) -> serde_json::Result<Self> {
        let mut value: serde_json::Value = serde_json::from_str(text)?;
        if let Some(object) = value.as_object_mut() {
            if !object.contains_key("type") {
                let kind = match object.contains_key("step") {
                    true => "step",
                    false => "epoch",
                };
                object.insert("type".into(), kind.into());
            }
        }
        serde_json::from_value(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step() -> StepLine {
        StepLine {
            step: 3,
            epoch: 0,
            loss: 2.5,
            lr: 0.1,
            images_per_sec: None,
            tokens_per_sec: Some(1000.0),
            comm_hidden: None,
            grad_norm: Some(1.5),
            loss_scale: None,
            pipeline: Some(PipelineReport {
                bubble: vec![0.2, 0.3],
                bubble_theory: 0.25,
                peak_micro_batches: vec![2, 1],
                peak_activation_bytes: vec![10, 5],
            }),
        }
    }

    /// Written lines carry their type and time, and read back as the same line.
    #[test]
    fn lines_round_trip_with_type_and_time() {
        let epoch = Line::Epoch(EpochLine {
            epoch: 1,
            train_loss: 1.0,
            train_acc: Some(0.5),
            val_loss: 1.2,
            val_acc: None,
            seconds: 3.0,
            skipped_steps: None,
            skipped_samples: Some(2),
        });
        for line in [Line::Step(step()), epoch] {
            let json = line.to_json().unwrap();
            let value: serde_json::Value = serde_json::from_str(&json).unwrap();
            assert!(value["time"].as_f64().unwrap() > 1.7e9, "{json}");
            assert!(value["type"] == "step" || value["type"] == "epoch");
            assert_eq!(Line::parse(&json).unwrap(), line);
        }
    }

    /// Lines written before `"type"` existed read by their keys.
    #[test]
    fn older_lines_read_by_their_keys() {
        let old_step = r#"{"step":0,"epoch":0,"loss":2.0,"lr":0.1,"images_per_sec":50.0}"#;
        let Line::Step(line) = Line::parse(old_step).unwrap() else {
            panic!("a step line")
        };
        assert_eq!(line.throughput(), Some(50.0));
        let old_epoch = r#"{"epoch":0,"train_loss":2.0,"val_loss":2.1,"seconds":1.0}"#;
        assert!(matches!(Line::parse(old_epoch).unwrap(), Line::Epoch(_)));
    }
}
