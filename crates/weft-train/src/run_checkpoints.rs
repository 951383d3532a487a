//! Checkpoints for resuming a run, inside its folder: `RUN/checkpoints/step-NNNNNNNN/`, each the
//! trainer's sharded checkpoint (weft-parallel's format, or the tensor-parallel one under `--tp`:
//! the model, the optimizer state and master weights by shard; one folder per stage under `--pp`)
//! beside `progress.json` (the steps done, the loss scaler's state and each rank's sums over the
//! epoch so far; the data order, learning rate and dropout masks all derive from the seed and
//! the step). Writing is atomic twice over: the sharded folder is renamed into
//! place by its writers, then rank 0 writes `progress.json`, so a folder without it is
//! incomplete and never resumed from. `--keep-last K` removes all but the newest K complete
//! checkpoints after each save. `--resume PATH` takes a run folder (its newest complete
//! checkpoint) or one checkpoint folder.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use weft_precision::LossScalerState;

use crate::run_dir::write_atomically;

const PROGRESS: &str = "progress.json";
const FOLDER: &str = "checkpoints";

/// The checkpoint flags every trainer takes: the "Checkpointing" section.
#[derive(Debug, Clone, Default, Args, Serialize)]
#[command(next_help_heading = "Checkpointing")]
#[serde(rename_all = "kebab-case")]
pub struct CheckpointFlags {
    /// Write a checkpoint to RUN/checkpoints/step-N every N optimizer steps (the model and its
    /// buffers, the optimizer state and master weights by shard, the steps done, the loss
    /// scaler)
    #[arg(long)]
    pub save_every: Option<usize>,
    /// Keep only the newest K checkpoints of --save-every
    #[arg(long)]
    pub keep_last: Option<usize>,
    /// Continue a run: PATH is its run folder (its newest complete checkpoint) or one checkpoint
    /// folder in it; the run goes on in that folder, appending to its metrics.jsonl, up to
    /// --steps/--epochs, with the data order, augmentation, learning rate and dropout of the
    /// uninterrupted run
    #[arg(long)]
    pub resume: Option<PathBuf>,
}

impl CheckpointFlags {
    /// Refuses bad values and combinations, one line each.
    pub fn validate(&self, init_from: bool) -> Result<()> {
        if self.save_every == Some(0) || self.keep_last == Some(0) {
            bail!("--save-every and --keep-last must be at least 1");
        }
        if self.keep_last.is_some() && self.save_every.is_none() {
            bail!("--keep-last needs --save-every");
        }
        if self.resume.is_some() && init_from {
            bail!("--resume and --init-from exclude each other: a resumed run has its weights");
        }
        Ok(())
    }

    /// Whether the run saves or resumes checkpoints.
    pub fn in_use(&self) -> bool {
        self.save_every.is_some() || self.resume.is_some()
    }

    /// Whether step `step` (steps done) ends with a checkpoint.
    pub fn saves_after(&self, step: usize) -> bool {
        self.save_every.is_some_and(|n| step.is_multiple_of(n))
    }
}

/// Where a run stood when its checkpoint was written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Optimizer steps done: the resumed run's first step.
    pub step: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scaler: Option<LossScalerState>,
    /// Each rank's sums over the epoch's steps so far (loss, …), when the checkpoint falls
    /// inside an epoch: the resumed run's epoch line then counts the steps before it too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub epoch_totals: Vec<Vec<f64>>,
}

/// A rank's pipeline stage and the number of stages ([`Stage::WHOLE`]: no pipeline). Each
/// stage writes its part of a checkpoint into a folder of its own inside the step's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stage {
    pub index: usize,
    pub count: usize,
}

impl Stage {
    pub const WHOLE: Stage = Stage { index: 0, count: 1 };

    /// The folder of this stage's part of checkpoint `dir`: `dir/stage-SS-of-NN`, or `dir`
    /// itself without a pipeline.
    pub fn part(self, dir: &Path) -> PathBuf {
        match self.count {
            1 => dir.to_path_buf(),
            n => dir.join(format!("stage-{:02}-of-{n:02}", self.index)),
        }
    }

    /// The number of pipeline stages checkpoint `dir` was written with (1: no pipeline).
    pub fn written(dir: &Path) -> Result<usize> {
        let entries =
            std::fs::read_dir(dir).with_context(|| format!("{}: cannot list", dir.display()))?;
        Ok(entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .find_map(|name| name.strip_prefix("stage-00-of-")?.parse::<usize>().ok())
            .unwrap_or(1))
    }
}

/// `RUN/checkpoints/step-NNNNNNNN`.
pub fn step_dir(run: &Path, step: usize) -> PathBuf {
    run.join(FOLDER).join(format!("step-{step:08}"))
}

/// Records `progress` in the written checkpoint `dir`, completing it.
pub fn complete(dir: &Path, progress: &Progress) -> Result<()> {
    write_atomically(&dir.join(PROGRESS), &serde_json::to_vec_pretty(progress)?)
}

/// What the checkpoint `dir` records.
pub fn read_progress(dir: &Path) -> Result<Progress> {
    let path = dir.join(PROGRESS);
    let text = std::fs::read(&path).with_context(|| format!("{}: cannot read", path.display()))?;
    serde_json::from_slice(&text)
        .with_context(|| format!("{}: not a progress record", path.display()))
}

/// The complete checkpoints under run folder `run`, oldest first.
fn complete_checkpoints(run: &Path) -> Result<Vec<PathBuf>> {
    let folder = run.join(FOLDER);
    let mut found: Vec<PathBuf> = std::fs::read_dir(&folder)
        .with_context(|| format!("{}: cannot list", folder.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| n.starts_with("step-") && !n.contains('.'))
                && p.join(PROGRESS).is_file()
        })
        .collect();
    found.sort();
    Ok(found)
}

/// The checkpoint `--resume PATH` names and the run folder it belongs to: PATH itself when it
/// is a complete checkpoint (inside `RUN/checkpoints/`), else the newest complete one of run
/// folder PATH.
pub fn resolve(path: &Path) -> Result<(PathBuf, PathBuf)> {
    if path.join(PROGRESS).is_file() {
        let run = path
            .parent()
            .and_then(Path::parent)
            .filter(|_| path.parent().and_then(Path::file_name) == Some(FOLDER.as_ref()))
            .with_context(|| {
                format!(
                    "--resume {}: a checkpoint outside RUN/{FOLDER}/",
                    path.display()
                )
            })?;
        return Ok((path.to_path_buf(), run.to_path_buf()));
    }
    if !path.join(FOLDER).is_dir() {
        bail!(
            "--resume {}: neither a checkpoint (no {PROGRESS}) nor a run folder with {FOLDER}/",
            path.display()
        );
    }
    match complete_checkpoints(path)?.pop() {
        Some(newest) => Ok((newest, path.to_path_buf())),
        None => bail!(
            "--resume {}: no complete checkpoint in {FOLDER}/",
            path.display()
        ),
    }
}

/// Removes the checkpoints of `run` past step `step` (complete or not): a run resumed from an
/// earlier checkpoint writes its own.
pub fn discard_after(run: &Path, step: usize) -> Result<()> {
    let folder = run.join(FOLDER);
    let later = std::fs::read_dir(&folder)
        .with_context(|| format!("{}: cannot list", folder.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            let number = name.as_deref().and_then(|n| n.strip_prefix("step-"));
            let number = number.and_then(|n| n.split('.').next()?.parse::<usize>().ok());
            number.is_some_and(|n| n > step)
        });
    for dir in later {
        let _ = std::fs::remove_file(dir.join(PROGRESS));
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("{}: cannot remove", dir.display()))?;
    }
    Ok(())
}

/// Removes all but the newest `keep` complete checkpoints of `run`.
pub fn prune(run: &Path, keep: usize) -> Result<()> {
    let found = complete_checkpoints(run)?;
    for old in &found[..found.len().saturating_sub(keep)] {
        // The progress record first: a half-removed folder is then incomplete, never resumed.
        std::fs::remove_file(old.join(PROGRESS))
            .and_then(|()| std::fs::remove_dir_all(old))
            .with_context(|| format!("{}: cannot remove", old.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(run: &Path, step: usize, complete_it: bool) -> PathBuf {
        let dir = step_dir(run, step);
        std::fs::create_dir_all(&dir).unwrap();
        if complete_it {
            complete(
                &dir,
                &Progress {
                    step,
                    loss_scaler: None,
                    epoch_totals: Vec::new(),
                },
            )
            .unwrap();
        }
        dir
    }

    #[test]
    fn resume_takes_the_newest_complete_checkpoint_and_prune_keeps_the_newest() {
        let root = tempfile::tempdir().unwrap();
        let run = root.path().join("run");
        for step in [3, 6, 9] {
            checkpoint(&run, step, true);
        }
        checkpoint(&run, 12, false);
        let (dir, of) = resolve(&run).unwrap();
        assert_eq!((dir.clone(), of.clone()), (step_dir(&run, 9), run.clone()));
        assert_eq!(read_progress(&dir).unwrap().step, 9);
        assert_eq!(
            resolve(&step_dir(&run, 6)).unwrap(),
            (step_dir(&run, 6), run.clone())
        );
        prune(&run, 2).unwrap();
        assert!(!step_dir(&run, 3).exists());
        assert!(step_dir(&run, 6).exists() && step_dir(&run, 9).exists());
        discard_after(&run, 6).unwrap();
        assert!(step_dir(&run, 6).exists());
        assert!(!step_dir(&run, 9).exists() && !step_dir(&run, 12).exists());
        checkpoint(&run, 12, false);
        let err = resolve(&step_dir(&run, 12)).unwrap_err().to_string();
        assert!(err.starts_with("--resume "), "{err}");
        let err = resolve(root.path()).unwrap_err().to_string();
        assert!(err.contains("neither a checkpoint"), "{err}");
    }
}
