//! The flags of the GPT trainer (`train-gpt`): the shared sections of [`crate::flags`] with its
//! model and data sections, and the checks that fail before any work starts.

use anyhow::{bail, Result};
use weft_parallel::pipeline::partition;

use crate::flags::TokenSource;
use crate::flags::{GptDefaults, RunArgs};
use crate::language_model::{DataVocab, LanguageModel};
use crate::optim_setup::OptimizerSettings;

pub use crate::flags::{PipelineBalance, PipelineSchedule};

/// Flags of `train-gpt`.
pub type GptArgs = RunArgs<GptDefaults>;

impl GptArgs {
    /// The number of ranks (see [`ParallelFlags::ranks`]).
    pub fn ranks(&self) -> usize {
        self.parallel.ranks(&self.training.device)
    }

    /// The data-parallel degree: `--dp`, or what the ranks leave after `--tp x --pp`.
    pub fn data_parallel(&self) -> usize {
        self.parallel.data_parallel(&self.training.device)
    }

    /// The model's blocks each pipeline stage runs: `--pp-split`, or balanced by `weights`
    /// (one per block; the parameter counts without them).
    pub fn stage_blocks(&self, weights: Option<&[u64]>) -> Result<Vec<std::ops::Range<usize>>> {
        let config = self.model_config()?;
        let counts = config.block_parameter_counts();
        let cuts = match &self.parallel.pp_split {
            Some(split) => partition::given(split, config.num_blocks()),
            None => partition::balanced(weights.unwrap_or(&counts), self.parallel.pp),
        };
        cuts.map_err(|e| anyhow::anyhow!("--pp-split: {e}"))
    }

    /// The optimizer settings of a run of `total_steps`.
    pub fn optimizer_settings(&self, total_steps: usize) -> Result<OptimizerSettings> {
        let offload = (
            self.parallel.offload_optimizer,
            self.parallel.delayed_update_from,
        );
        self.optim.settings(total_steps, offload)
    }

    /// The model these flags name (a fresh one with the vocabulary its data need: 256 for text
    /// read as bytes, the tokenizer's for tokenized text).
    pub fn model_config(&self) -> Result<LanguageModel> {
        let vocab = match (self.data.source()?, &self.data.tokenizer) {
            (TokenSource::Text(_), None) => DataVocab::Bytes,
            (TokenSource::Text(_), Some(spec)) => {
                let tokens = weft_data::Tokenizer::vocab_size_of(spec)
                    .map_err(|e| anyhow::anyhow!("--tokenizer {spec}: {e}"))?;
                DataVocab::Tokenizer(tokens)
            }
            _ => DataVocab::Model,
        };
        LanguageModel::from_flags(&self.model, self.training.seed, vocab)
    }

    /// Tokens per sequence: `--seq-len` or the model's context.
    pub fn seq_len(&self) -> Result<usize> {
        let context = self.model_config()?.context();
        Ok(self.data.seq_len.unwrap_or(context))
    }

    /// Checks every flag; the message of the error is one line naming the flag.
    pub fn validate(&self) -> Result<()> {
        let config = self.model_config()?;
        self.training.validate()?;
        self.optim.validate()?;
        self.data.validate()?;
        self.parallel.validate(&self.training.device)?;
        self.checkpoints.validate(self.model.init_from.is_some())?;
        let (tp, pp, zero) = (self.parallel.tp, self.parallel.pp, self.parallel.zero);
        config.check_layout(tp)?;
        if pp > config.num_blocks() {
            bail!(
                "--pp {pp} exceeds the {} blocks of {} (embeddings, {} layers of two halves, head)",
                config.num_blocks(),
                config.name(),
                (config.num_blocks() - 2) / 2
            );
        }
        self.stage_blocks(None)?;
        if self.parallel.sync_bn {
            bail!("--sync-bn: a GPT has no batch norm to synchronise");
        }
        let replicas = self.data_parallel();
        let batch = self.training.batch_size;
        if !batch.is_multiple_of(replicas) {
            bail!(
                "--batch-size {batch} is not divisible by the {replicas} data-parallel replicas (--dp)"
            );
        }
        let (micro, per_rank) = (self.training.micro_batches, batch / replicas);
        if !per_rank.is_multiple_of(micro) {
            bail!("--micro-batches {micro} must divide the per-rank batch of {per_rank}");
        }
        match self.data.seq_len {
            Some(0) => bail!("--seq-len must be at least 1"),
            Some(n) if n > config.context() => bail!(
                "--seq-len {n} exceeds the context of {} ({})",
                config.context(),
                config.name()
            ),
            _ => {}
        }
        if pp > 1 && zero >= 2 {
            // ZeRO-2 and -3 keep only their shard of the token table's gradient, which the
            // first and last stage must sum whole.
            bail!("--zero {zero} is not supported with --pp {pp} yet (--zero 0 or 1)");
        }
        if !(0.0..1.0).contains(&self.model.dropout) {
            bail!("--dropout {} must be in [0, 1)", self.model.dropout);
        }
        if let Some(path) = &self.model.init_from {
            if !path.exists() {
                bail!("--init-from {}: no such file or folder", path.display());
            }
        }
        self.precision.policy()?;
        Ok(())
    }
}
