//! The flags of the ResNet trainer (`train-resnet`): the shared sections of [`crate::flags`]
//! with its model and data sections, and the checks that fail before any work starts.

use anyhow::{bail, Result};

use crate::flags::{ResnetDefaults, RunArgs};
use crate::optim_setup::OptimizerSettings;

pub use crate::flags::{Augment, ChannelsLast, Compression, ConvStatsFlag, OptimizerKind};

/// Flags of `train-resnet`.
pub type TrainArgs = RunArgs<ResnetDefaults>;

impl TrainArgs {
    /// The optimizer settings of a run of `total_steps`.
    pub fn optimizer_settings(&self, total_steps: usize) -> Result<OptimizerSettings> {
        let offload = (
            self.parallel.offload_optimizer,
            self.parallel.delayed_update_from,
        );
        self.optim.settings(total_steps, offload)
    }

    /// The number of ranks: `--nproc`, or one per visible GPU for a bare `--device cuda`, or 1.
    pub fn ranks(&self) -> usize {
        self.parallel.ranks(&self.training.device)
    }

    /// Checks every flag; the message of the error is one line naming the flag.
    pub fn validate(&self) -> Result<()> {
        let model = &self.model.model;
        if !weft_models::resnet::MODEL_NAMES.contains(&model.as_str()) {
            bail!(
                "--model {model}: unknown model; expected one of {}",
                weft_models::resnet::MODEL_NAMES.join(", ")
            );
        }
        self.training.validate()?;
        self.optim.validate()?;
        self.parallel.validate(&self.training.device)?;
        self.checkpoints.validate(self.model.init_from.is_some())?;
        if self.parallel.tp > 1 || self.parallel.pp > 1 {
            bail!(
                "--tp {} --pp {}: a ResNet has no tensor-parallel or pipeline split (its ranks are data-parallel)",
                self.parallel.tp,
                self.parallel.pp
            );
        }
        if self.training.checkpoint_activations == crate::flags::Recompute::Attention {
            bail!("--checkpoint-activations attention: {model} has no attention (give full)");
        }
        let (batch, ranks) = (self.training.batch_size, self.ranks());
        if !batch.is_multiple_of(ranks) {
            bail!("--batch-size {batch} is not divisible by the {ranks} ranks (--nproc)");
        }
        let (micro, per_rank) = (self.training.micro_batches, batch / ranks);
        if !per_rank.is_multiple_of(micro) {
            bail!(
                "--micro-batches {micro} does not divide the per-rank batch of {per_rank} (--batch-size {batch} over {ranks} ranks)"
            );
        }
        if self.data.image_size < 8 {
            bail!(
                "--image-size {} is too small (at least 8)",
                self.data.image_size
            );
        }
        if self.model.num_classes == Some(0) {
            bail!("--num-classes must be at least 1");
        }
        if let Some(path) = &self.model.init_from {
            if !path.is_file() {
                bail!("--init-from {}: no such file", path.display());
            }
        }
        self.precision.policy()?;
        crate::data::DataSpec::parse(&self.data.data)?;
        Ok(())
    }
}
