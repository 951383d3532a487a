//! The run folder `runs/<name>/`: `config.json`, `metrics.jsonl` (one JSON object per step and
//! per epoch, flushed as written) and the final model (`model.safetensors` with torchvision or
//! GPT-2 names, or a Llama's Hugging Face folder `hf/`, plus `checkpoint.json` metadata). Every
//! file is written atomically.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;
use weft_tensor::{private_files, ParamStore};

use crate::distributed::RankContext;
use crate::fit::metrics::Line;

/// An open run folder.
pub struct RunDir {
    path: PathBuf,
    metrics: BufWriter<File>,
}

impl RunDir {
    /// Creates `root/name` owner-only (it must not exist yet: checked by the creation itself)
    /// and writes `config.json`.
    pub fn create(root: &Path, name: &str, config: &impl Serialize) -> Result<Self> {
        let path = root.join(name);
        private_files::create_private_dir_all(root)
            .with_context(|| format!("{}: cannot create the runs folder", root.display()))?;
        match private_files::create_private_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => anyhow::bail!(
                "{}: run folder exists already; choose another --name",
                path.display()
            ),
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("{}: cannot create the run folder", path.display()))
            }
        }
        write_atomically(
            &path.join("config.json"),
            &serde_json::to_vec_pretty(config)?,
        )?;
        let metrics_path = path.join("metrics.jsonl");
        let file = File::create(&metrics_path)
            .with_context(|| format!("{}: cannot create", metrics_path.display()))?;
        Ok(Self {
            path,
            metrics: BufWriter::new(file),
        })
    }

    /// Opens the existing run folder `path` to go on writing it (a resumed run): its
    /// `metrics.jsonl` keeps the lines `keep` accepts (those before the resumed step), and new
    /// lines are appended.
    pub fn reopen(path: &Path, keep: impl Fn(&serde_json::Value) -> bool) -> Result<Self> {
        let metrics_path = path.join("metrics.jsonl");
        let text = fs::read_to_string(&metrics_path)
            .with_context(|| format!("{}: cannot read", metrics_path.display()))?;
        let mut kept = String::new();
        let lines: Vec<&str> = text.lines().collect();
        for (number, line) in lines.iter().enumerate() {
            let value: serde_json::Value = match serde_json::from_str(line) {
                Ok(value) => value,
                // A last line cut short (a crash, a full disk) is dropped; any other that is not
                // JSON means the file is not a run's.
                Err(_) if number + 1 == lines.len() && !text.ends_with('\n') => {
                    tracing::warn!(
                        "{}: its last line is cut short and is dropped",
                        metrics_path.display()
                    );
                    continue;
                }
                Err(e) => anyhow::bail!(
                    "{} line {}: not JSON ({e})",
                    metrics_path.display(),
                    number + 1
                ),
            };
            if keep(&value) {
                kept.push_str(line);
                kept.push('\n');
            }
        }
        write_atomically(&metrics_path, kept.as_bytes())?;
        let file = fs::OpenOptions::new()
            .append(true)
            .open(&metrics_path)
            .with_context(|| format!("{}: cannot open", metrics_path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            metrics: BufWriter::new(file),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one JSON line to `metrics.jsonl` and flushes it.
    /// Appends `line` to `metrics.jsonl`, stamped with its type and the time, and flushes it.
    pub fn log_line(&mut self, line: &Line) -> Result<()> {
        writeln!(self.metrics, "{}", line.to_json()?)?;
        self.metrics.flush()?;
        Ok(())
    }

    /// Writes `model.safetensors` and `checkpoint.json` (metadata: step, epoch, anything else).
    pub fn save_checkpoint(
        &self,
        store: &ParamStore,
        metadata: &impl Serialize,
    ) -> Result<PathBuf> {
        self.save_checkpoint_with(
            |folder| {
                let weights = folder.join("model.safetensors");
                weft_tensor::state_dict::save_safetensors(store, &weights)?;
                Ok(weights)
            },
            metadata,
        )
    }

    /// Writes the model with `write_weights` (given the run folder; it writes atomically and
    /// returns the path it wrote), then `checkpoint.json`.
    pub fn save_checkpoint_with(
        &self,
        write_weights: impl FnOnce(&Path) -> Result<PathBuf>,
        metadata: &impl Serialize,
    ) -> Result<PathBuf> {
        let weights = write_weights(&self.path)?;
        write_atomically(
            &self.path.join("checkpoint.json"),
            &serde_json::to_vec_pretty(metadata)?,
        )?;
        Ok(weights)
    }
}

/// The run folder of a job: rank 0 creates it and writes to it; every rank knows its path.
pub struct RunFolder {
    pub path: PathBuf,
    /// The open folder, on rank 0 only.
    pub writer: Option<RunDir>,
}

impl RunFolder {
    /// Opens `out/name` (rank 0 creates it with `config`), `name` defaulting to
    /// `default_name()` ([`default_run_name`]), which several ranks agree on only when a
    /// launcher's job id names the run; otherwise they must be given the name.
    pub fn open(
        out: &Path,
        name: Option<&str>,
        default_name: impl FnOnce() -> String,
        config: &impl Serialize,
        ctx: &RankContext,
    ) -> Result<Self> {
        let name = match (name, ctx.world_size) {
            (Some(name), _) => name.to_string(),
            (None, 1) => default_name(),
            (None, _) if launcher_job_id(|key| std::env::var(key).ok()).is_some() => default_name(),
            (None, _) => anyhow::bail!(
                "--name is required when several ranks share one run folder and no launcher's job id names it (WEFT_JOB_ID, TORCHELASTIC_RUN_ID, SLURM_JOB_ID)"
            ),
        };
        let writer = match ctx.is_main() {
            true => Some(RunDir::create(out, &name, config)?),
            false => None,
        };
        ctx.barrier()?;
        Ok(Self {
            path: out.join(&name),
            writer,
        })
    }
}

impl RunFolder {
    /// Reopens run folder `path` on rank 0 ([`RunDir::reopen`]) for a resumed job.
    pub fn reopen(
        path: &Path,
        keep: impl Fn(&serde_json::Value) -> bool,
        ctx: &RankContext,
    ) -> Result<Self> {
        let writer = match ctx.is_main() {
            true => Some(RunDir::reopen(path, keep)?),
            false => None,
        };
        ctx.barrier()?;
        Ok(Self {
            path: path.to_path_buf(),
            writer,
        })
    }
}

/// `model-data-<id>` (the data's kind: `synthetic`, `text`, …): the id the launcher gave the job
/// where one started it (weft-run's `WEFT_JOB_ID`, torchrun's `TORCHELASTIC_RUN_ID`, Slurm's
/// `SLURM_JOB_ID.SLURM_STEP_ID`: every rank reads the same), else the Unix seconds now.
pub fn default_run_name(model: &str, data: &str) -> String {
    let data = data.split(':').next().unwrap_or("data");
    let id = launcher_job_id(|key| std::env::var(key).ok()).unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        now.map(|d| d.as_secs()).unwrap_or(0).to_string()
    });
    format!("{model}-{data}-{id}")
}

/// The launcher's id of this job, as a folder name's part (characters other than letters,
/// digits, `.`, `_` and `-` replaced by `-`); `None` outside a launcher.
fn launcher_job_id(lookup: impl Fn(&str) -> Option<String>) -> Option<String> {
    let id = lookup("WEFT_JOB_ID")
        .or_else(|| lookup("TORCHELASTIC_RUN_ID"))
        .or_else(|| {
            let job = lookup("SLURM_JOB_ID")?;
            Some(match lookup("SLURM_STEP_ID") {
                Some(step) => format!("{job}.{step}"),
                None => job,
            })
        })?;
    let safe = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    Some(id.chars().map(|c| if safe(c) { c } else { '-' }).collect())
}

/// Writes `bytes` to a temporary file next to `path`, flushed to the disk, then renames it into
/// place and flushes the folder ([`weft_tensor::durable::write`]).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    weft_tensor::durable::write(path, bytes)
        .with_context(|| format!("{}: cannot write durably", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ranks of a launched job agree on its run's name: the launcher's id, safe for a
    /// folder's name.
    #[test]
    fn launched_ranks_name_the_run_from_the_launchers_job_id() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |key: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            launcher_job_id(env(&[("WEFT_JOB_ID", "a1b2")])).unwrap(),
            "a1b2"
        );
        let slurm = env(&[("SLURM_JOB_ID", "4242"), ("SLURM_STEP_ID", "0")]);
        assert_eq!(launcher_job_id(slurm).unwrap(), "4242.0");
        let torchrun = env(&[("TORCHELASTIC_RUN_ID", "run/5 f")]);
        assert_eq!(launcher_job_id(torchrun).unwrap(), "run-5-f");
        assert!(launcher_job_id(env(&[])).is_none());
    }

    #[test]
    fn writes_config_and_metric_lines_and_refuses_to_overwrite() {
        let root = tempfile::tempdir().unwrap();
        let mut run =
            RunDir::create(root.path(), "r", &serde_json::json!({"model": "resnet20"})).unwrap();
        let step = |step: usize, loss: f64, comm_hidden: Option<f64>, grad_norm: Option<f64>| {
            Line::Step(crate::fit::metrics::StepLine {
                step,
                epoch: 0,
                loss,
                lr: 0.1,
                images_per_sec: Some(10.0),
                tokens_per_sec: None,
                comm_hidden,
                grad_norm,
                loss_scale: None,
                pipeline: None,
            })
        };
        run.log_line(&step(0, 2.3, None, None)).unwrap();
        run.log_line(&step(1, 2.2, Some(0.5), Some(1.5))).unwrap();
        let text = fs::read_to_string(run.path().join("metrics.jsonl")).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["step"], 1);
        assert_eq!(lines[1]["type"], "step");
        assert!(lines[1]["time"].as_f64().unwrap() > 1.7e9);
        assert_eq!(lines[0]["loss"], 2.3);
        assert!(lines[0].get("comm_hidden").is_none());
        assert_eq!(lines[1]["comm_hidden"], 0.5);
        assert!(lines[0].get("grad_norm").is_none());
        assert_eq!(lines[1]["grad_norm"], 1.5);
        let config: serde_json::Value =
            serde_json::from_slice(&fs::read(run.path().join("config.json")).unwrap()).unwrap();
        assert_eq!(config["model"], "resnet20");
        let again = RunDir::create(root.path(), "r", &config).err().unwrap();
        assert!(again
            .to_string()
            .ends_with("run folder exists already; choose another --name"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(run.path()).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "the run folder is owner-only");
        }
    }
}
