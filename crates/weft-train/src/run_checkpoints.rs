//! Checkpoints for resuming a run, inside its folder: `RUN/checkpoints/step-NNNNNNNN/`, each the
//! trainer's sharded checkpoint (weft-parallel's format, or the tensor-parallel one under `--tp`:
//! the model, the optimizer state and master weights by shard; one folder per stage under `--pp`)
//! beside `progress.json`, its commit record (the steps done, the loss scaler's state and each
//! rank's sums over the epoch so far; the data order, learning rate and dropout masks all derive
//! from the seed and the step). Writing is atomic and durable twice over: the sharded folder is
//! staged, flushed and renamed into place by its writers, then rank 0 writes `progress.json`
//! last, so a folder without a valid record does not exist for resume. `--keep-last K` removes
//! all but the newest K complete checkpoints after each save. `--resume PATH` takes a run
//! folder (its newest checkpoint that [`check`] finds whole; damaged ones are skipped, each
//! named with why) or one checkpoint folder (which must be whole).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use weft_precision::LossScalerState;

use crate::run_dir::write_atomically;

const PROGRESS: &str = "progress.json";
const FOLDER: &str = "checkpoints";

/// The checkpoint flags every trainer takes: the "Checkpointing" section.
#[derive(Debug, Clone, Args, Serialize)]
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
    /// Seconds a checkpoint's save may take on every rank (the ranks wait for each other's
    /// writes without the collectives' timeout); past it the save stops on every rank, naming
    /// the ranks still writing, and the previous checkpoint stays the newest
    #[arg(long, value_name = "SECONDS", default_value_t = 1800.0)]
    pub save_timeout: f64,
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
        if !(self.save_timeout.is_finite() && self.save_timeout > 0.0) {
            bail!(
                "--save-timeout {} must be a positive number of seconds",
                self.save_timeout
            );
        }
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

/// Records `progress` in the written checkpoint `dir`, completing it (durably: the record and
/// the folders holding it flushed).
pub fn complete(dir: &Path, progress: &Progress) -> Result<()> {
    write_atomically(&dir.join(PROGRESS), &serde_json::to_vec_pretty(progress)?)?;
    weft_tensor::durable::sync_parent(dir)
        .with_context(|| format!("{}: cannot flush its folder", dir.display()))
}

/// What the checkpoint `dir` records.
pub fn read_progress(dir: &Path) -> Result<Progress> {
    let path = dir.join(PROGRESS);
    let text = std::fs::read(&path).with_context(|| format!("{}: cannot read", path.display()))?;
    serde_json::from_slice(&text)
        .with_context(|| format!("{}: not a progress record", path.display()))
}

/// The checkpoint folders under run folder `run` (named `step-N`, complete or not), oldest
/// first.
fn step_folders(run: &Path) -> Result<Vec<PathBuf>> {
    let folder = run.join(FOLDER);
    let mut found: Vec<PathBuf> = std::fs::read_dir(&folder)
        .with_context(|| format!("{}: cannot list", folder.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| n.starts_with("step-") && !n.contains('.'))
        })
        .collect();
    found.sort();
    Ok(found)
}

/// The complete checkpoints under run folder `run` (a step folder with its record), oldest first.
fn complete_checkpoints(run: &Path) -> Result<Vec<PathBuf>> {
    let mut found = step_folders(run)?;
    found.retain(|p| p.join(PROGRESS).is_file());
    Ok(found)
}

/// What `--resume PATH` may resume from: the checkpoint PATH names, or run folder PATH's
/// checkpoints newest first, with the run folder they belong to.
#[derive(Debug)]
pub struct Candidates {
    /// Newest first.
    pub dirs: Vec<PathBuf>,
    pub run: PathBuf,
    /// PATH named one checkpoint: it must be whole, no other is tried.
    pub named: bool,
}

/// The checkpoints `--resume PATH` may resume from: PATH itself when it is a checkpoint folder
/// (`RUN/checkpoints/step-N`), else every step folder of run folder PATH, newest first.
pub fn candidates(path: &Path) -> Result<Candidates> {
    let in_run = path.parent().and_then(Path::file_name) == Some(FOLDER.as_ref());
    let step_named = path
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("step-"));
    if path.join(PROGRESS).is_file() || (in_run && step_named) {
        let run = path
            .parent()
            .and_then(Path::parent)
            .filter(|_| in_run)
            .with_context(|| {
                format!(
                    "--resume {}: a checkpoint outside RUN/{FOLDER}/",
                    path.display()
                )
            })?;
        return Ok(Candidates {
            dirs: vec![path.to_path_buf()],
            run: run.to_path_buf(),
            named: true,
        });
    }
    if !path.join(FOLDER).is_dir() {
        bail!(
            "--resume {}: neither a checkpoint (no {PROGRESS}) nor a run folder with {FOLDER}/",
            path.display()
        );
    }
    let mut dirs = step_folders(path)?;
    dirs.reverse();
    Ok(Candidates {
        dirs,
        run: path.to_path_buf(),
        named: false,
    })
}

/// Checks that checkpoint `dir` is whole without loading it: its record parses and names the
/// folder's step, each part (one per pipeline stage) has its manifest, every JSON file in it
/// parses, and every safetensors file's header parses and matches the file's length. Returns
/// the record; the error says what is damaged. (Whether the checkpoint fits the model is the
/// loader's check: a mismatch is the command's error, not damage.)
pub fn check(dir: &Path) -> Result<Progress> {
    let progress = read_progress(dir)?;
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
    if name.as_deref() != Some(format!("step-{:08}", progress.step).as_str()) {
        bail!(
            "{}: records step {}, not this folder's",
            dir.join(PROGRESS).display(),
            progress.step
        );
    }
    let stages = Stage::written(dir)?;
    for index in 0..stages {
        let part = Stage {
            index,
            count: stages,
        }
        .part(dir);
        if !["manifest.json", "tensor-parallel.json"]
            .iter()
            .any(|m| part.join(m).is_file())
        {
            bail!("{}: no manifest (an incomplete save)", part.display());
        }
    }
    check_files(dir)?;
    Ok(progress)
}

/// Every `.json` file under `dir` parses and every `.safetensors` file is whole.
fn check_files(dir: &Path) -> Result<()> {
    let listing = || format!("{}: cannot list", dir.display());
    for entry in std::fs::read_dir(dir).with_context(listing)? {
        let path = entry.with_context(listing)?.path();
        let extension = path.extension().and_then(|e| e.to_str());
        if path.is_dir() {
            check_files(&path)?;
        } else if extension == Some("json") {
            let text =
                std::fs::read(&path).with_context(|| format!("{}: cannot read", path.display()))?;
            serde_json::from_slice::<serde_json::Value>(&text)
                .with_context(|| format!("{}: not valid JSON", path.display()))?;
        } else if extension == Some("safetensors") {
            weft_tensor::state_dict::check_file(&path)?;
        }
    }
    Ok(())
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
    fn candidates_are_newest_first_and_prune_keeps_the_newest_complete() {
        let root = tempfile::tempdir().unwrap();
        let run = root.path().join("run");
        for step in [3, 6, 9] {
            checkpoint(&run, step, true);
        }
        checkpoint(&run, 12, false);
        let found = candidates(&run).unwrap();
        let newest_first: Vec<PathBuf> = [12, 9, 6, 3].map(|s| step_dir(&run, s)).into();
        assert_eq!(
            (found.dirs, found.run, found.named),
            (newest_first, run.clone(), false)
        );
        let named = candidates(&step_dir(&run, 6)).unwrap();
        assert_eq!(
            (named.dirs, named.run, named.named),
            (vec![step_dir(&run, 6)], run.clone(), true)
        );
        assert_eq!(read_progress(&step_dir(&run, 9)).unwrap().step, 9);
        prune(&run, 2).unwrap();
        assert!(!step_dir(&run, 3).exists());
        assert!(step_dir(&run, 6).exists() && step_dir(&run, 9).exists());
        discard_after(&run, 6).unwrap();
        assert!(step_dir(&run, 6).exists());
        assert!(!step_dir(&run, 9).exists() && !step_dir(&run, 12).exists());
        let err = candidates(root.path()).unwrap_err().to_string();
        assert!(err.contains("neither a checkpoint"), "{err}");
    }

    /// Each kind of damage is named; a whole checkpoint (a manifest, a whole file) passes.
    #[test]
    fn check_names_what_is_damaged() {
        let root = tempfile::tempdir().unwrap();
        let run = root.path().join("run");
        let dir = checkpoint(&run, 4, true);
        let err = check(&dir).unwrap_err().to_string();
        assert!(err.contains("no manifest"), "{err}");
        std::fs::write(dir.join("manifest.json"), "{}").unwrap();
        let device = candle_core::Device::Cpu;
        let w = candle_core::Tensor::ones(3, candle_core::DType::F32, &device).unwrap();
        let model = dir.join("model.safetensors");
        let tensors = std::collections::HashMap::from([("w".to_string(), w)]);
        weft_tensor::state_dict::save_tensors(&tensors, &model).unwrap();
        assert_eq!(check(&dir).unwrap().step, 4);
        let bytes = std::fs::read(&model).unwrap();
        std::fs::write(&model, &bytes[..bytes.len() - 2]).unwrap();
        let err = format!("{:#}", check(&dir).unwrap_err());
        assert!(
            err.contains("model.safetensors: not a whole safetensors file"),
            "{err}"
        );
        std::fs::write(&model, &bytes).unwrap();
        std::fs::write(dir.join("manifest.json"), "{\"format\": ").unwrap();
        let err = format!("{:#}", check(&dir).unwrap_err());
        assert!(err.contains("manifest.json: not valid JSON"), "{err}");
        std::fs::write(dir.join("manifest.json"), "{}").unwrap();
        std::fs::write(dir.join(PROGRESS), "{\"step\": 7}").unwrap();
        let err = check(&dir).unwrap_err().to_string();
        assert!(err.contains("records step 7"), "{err}");
    }
}
