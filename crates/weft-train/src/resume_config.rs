//! A resumed run's command against its checkpoint's: the run folder's `config.json` gives the
//! values of the flags the command does not give ([`config_of`], read by
//! [`crate::config_file::expand`]), and [`check_command`] refuses, before anything is touched,
//! a command that changes what the run trains — model, data, optimizer and its
//! hyper-parameters, precision, seed — naming the flag. What may change: how long it runs, its
//! checkpointing and logging, the layout over the ranks (resume in any split), and flags that
//! only change how fast the same steps run.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::Value;

use crate::run_checkpoints;

/// The flags a resumed command may set otherwise than its checkpoint's run.
pub const MAY_CHANGE: [&str; 29] = [
    // How long, checkpointing, logging.
    "steps",
    "epochs",
    "save-every",
    "keep-last",
    "save-timeout",
    "resume",
    "log-level",
    "quiet",
    "out",
    "name",
    // The layout: the same steps split otherwise over the ranks.
    "nproc",
    "dp",
    "tp",
    "pp",
    "zero",
    "micro-batches",
    "device",
    "schedule",
    "pp-split",
    "pp-balance",
    "offload-optimizer",
    // How fast the same steps run.
    "workers",
    "cuda-graph",
    "launch-ahead",
    "bucket-cap-mb",
    "last-bucket-cap-mb",
    "step-during-last-bucket",
    "checkpoint-activations",
    "deterministic",
];

/// The run folder a `--resume PATH` names (the folder itself, or the one holding the
/// checkpoint PATH), and its `config.json`.
pub fn config_of(resume: &Path) -> Result<(PathBuf, Value)> {
    let run = run_checkpoints::candidates(resume)?.run;
    let path = run.join("config.json");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "--resume {}: cannot read {}",
            resume.display(),
            path.display()
        )
    })?;
    let config = serde_json::from_str(&text).with_context(|| {
        format!(
            "--resume {}: {} is not JSON",
            resume.display(),
            path.display()
        )
    })?;
    Ok((path, config))
}

/// Refuses `command` (a trainer's flags) where it differs from the run `resume` names on a
/// flag outside [`MAY_CHANGE`]: one line naming the flag and both values.
pub fn check_command(resume: &Path, command: &impl Serialize) -> Result<()> {
    let (path, saved) = config_of(resume)?;
    let now = serde_json::to_value(command)?;
    let (Value::Object(saved), Value::Object(now)) = (saved, now) else {
        bail!(
            "--resume {}: {} is not a table of flags",
            resume.display(),
            path.display()
        );
    };
    for (key, value) in &now {
        let key = key.replace('_', "-");
        if MAY_CHANGE.contains(&key.as_str()) {
            continue;
        }
        let was = saved
            .get(&key)
            .or_else(|| saved.get(&key.replace('-', "_")))
            .unwrap_or(&Value::Null);
        if was != value {
            bail!(
                "--resume {}: --{key} {} differs from the checkpoint's run ({}); only the steps, checkpointing, logging and the layout over the ranks may change",
                resume.display(),
                text(value),
                text(was)
            );
        }
    }
    Ok(())
}

/// A value as a flag's text (`none` for an unset one).
fn text(value: &Value) -> String {
    match value {
        Value::Null => "none".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
