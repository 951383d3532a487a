//! The "Training" section: the batch, how long, the seed and the device.

use std::marker::PhantomData;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use weft_tensor::{BlockModel, Checkpointing};

use super::TaskDefaults;

/// How a run trains: batch, length, accumulation, recomputation, seed and device.
/// What the backward recomputes instead of keeping (`--checkpoint-activations`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    /// Keep every block's activations.
    #[default]
    #[value(alias = "false")]
    None,
    /// Recompute every block (each keeps its input).
    #[value(alias = "true")]
    Full,
    /// Recompute the attention half of each transformer layer (keeping its input), keep the
    /// MLP halves' activations.
    Attention,
}

impl Recompute {
    /// Which blocks of `model` recompute: an attention half is a block named `….attn`.
    pub fn plan(self, model: &BlockModel) -> Checkpointing {
        match self {
            Recompute::None => Checkpointing::None,
            Recompute::Full => Checkpointing::All,
            Recompute::Attention => Checkpointing::Blocks(
                (model.blocks().iter().enumerate())
                    .filter(|(_, block)| block.name().ends_with(".attn"))
                    .map(|(i, _)| i)
                    .collect(),
            ),
        }
    }

    /// Whether anything is recomputed.
    pub fn any(self) -> bool {
        self != Recompute::None
    }
}

#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Training")]
#[serde(rename_all = "kebab-case")]
pub struct TrainingFlags<D: TaskDefaults> {
    /// Read flags from FILE: TOML, or JSON (a run folder's config.json, which reproduces the
    /// run), keys the long flag names (`batch-size = 64`) at the top level or in a table named
    /// after the flag's section of this help (`[optimizer]`); flags given here win
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<std::path::PathBuf>,
    /// Global batch size (images, or sequences)
    #[arg(long, default_value = D::BATCH_SIZE)]
    pub batch_size: usize,
    /// Passes over the training set
    #[arg(long, default_value = D::EPOCHS)]
    pub epochs: usize,
    /// Stop after this many optimizer steps in total (overrides epochs when smaller)
    #[arg(long)]
    pub steps: Option<usize>,
    /// Split each rank's batch into M micro-batches whose gradients accumulate before one
    /// optimizer step (only the last one communicates; with --pp, the micro-batches in flight
    /// through the pipeline)
    #[arg(long, default_value_t = 1)]
    pub micro_batches: usize,
    /// Recompute blocks' forward during backward instead of storing their activations (the
    /// same dropout masks: they derive from the seed, not from a generator's state): `full`
    /// (the flag alone) every block, `attention` a transformer's attention halves only
    /// (selective: their activations freed, the MLP halves' kept)
    #[arg(long, value_enum, num_args = 0..=1, default_value = "none", default_missing_value = "full")]
    pub checkpoint_activations: Recompute,
    /// Under fp16-mixed, end the run when more than this many steps in a row are skipped for
    /// inf/NaN gradients (each halves the loss scale); without loss scaling a non-finite loss
    /// ends the run at once
    #[arg(long, default_value_t = 20)]
    pub max_skipped_steps: usize,
    /// Seed of the initialisation, the data order and augmentation, dropout and synthetic data
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// cpu | cuda | cuda:N
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// On a GPU, repeat exactly: cuDNN picks among the algorithms it marks deterministic
    /// (convolutions; the fused attention's deterministic backward), as PyTorch's
    /// use_deterministic_algorithms; may be slower. CPU runs repeat exactly without it
    #[arg(long, default_value_t = false)]
    pub deterministic: bool,
    #[arg(skip)]
    #[serde(skip)]
    pub defaults: PhantomData<D>,
}

impl<D: TaskDefaults> TrainingFlags<D> {
    /// Checks the values; the error is one line naming the flag.
    pub fn validate(&self) -> Result<()> {
        if let Some(path) = &self.config {
            bail!(
                "--config {}: read before the flags are parsed (weft_train::config_file::expand); this command line was not",
                path.display()
            );
        }
        if self.batch_size == 0 {
            bail!("--batch-size must be at least 1");
        }
        if self.epochs == 0 && self.steps.is_none() {
            bail!("--epochs must be at least 1");
        }
        if self.steps == Some(0) {
            bail!("--steps must be at least 1");
        }
        if self.micro_batches == 0 {
            bail!("--micro-batches must be at least 1");
        }
        crate::device::parse_device(&self.device)?;
        Ok(())
    }

    /// The run's optimizer steps: `--steps`, or the epochs' steps when fewer.
    pub fn total_steps(&self, steps_per_epoch: usize) -> usize {
        self.steps
            .unwrap_or(usize::MAX)
            .min(self.epochs.max(1) * steps_per_epoch)
    }
}
