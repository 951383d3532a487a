//! The trainers' flags, in sections shared by every trainer (each a clap argument group, a
//! section of `--help` and a table of a `--config` file): [`TrainingFlags`], [`OptimizerFlags`],
//! [`PrecisionFlags`], [`ParallelFlags`], the checkpoint and logging flags, and each task's
//! model and data sections. A section whose defaults differ between trainers takes them from
//! the trainer's [`TaskDefaults`]; no flag is defined twice. Enumerations are clap `ValueEnum`s,
//! and every section serializes under its flags' long names (a run's `config.json`).

mod gpt;
mod optimizer;
mod parallel;
mod precision;
mod resnet;
mod training;

pub use gpt::{GptDefaults, GptFlags, TokenDataFlags, TokenSource};
pub use optimizer::{LrScheduleName, OptimizerFlags, OptimizerKind};
pub use parallel::{Compression, ParallelFlags, PipelineBalance, PipelineSchedule};
pub use precision::{Precision, PrecisionFlags};
pub use resnet::{
    Augment, ChannelsLast, ConvStatsFlag, ImageDataFlags, ResnetDefaults, ResnetFlags,
};
pub use training::{Recompute, TrainingFlags};

/// Every section of one trainer's flags: its task's model and data sections and the shared
/// ones (`--help` lists them in this order).
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
#[serde(bound = "")]
pub struct RunArgs<T: TaskDefaults> {
    #[command(flatten)]
    #[serde(flatten)]
    pub model: T::Model,
    #[command(flatten)]
    #[serde(flatten)]
    pub data: T::Data,
    #[command(flatten)]
    #[serde(flatten)]
    pub training: TrainingFlags<T>,
    #[command(flatten)]
    #[serde(flatten)]
    pub optim: OptimizerFlags<T>,
    #[command(flatten)]
    #[serde(flatten)]
    pub precision: PrecisionFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub parallel: ParallelFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub checkpoints: crate::run_checkpoints::CheckpointFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub log: crate::logging::LogFlags,
}

impl<T: TaskDefaults> Default for RunArgs<T> {
    /// Every flag at its default for task `T`: what the trainer runs given no flags. Benches,
    /// checks and tests start from it and set the values they need, rather than writing flags.
    fn default() -> Self {
        use clap::{Args, FromArgMatches};
        let command = Self::augment_args(clap::Command::new("weft"));
        let matches = command.get_matches_from(["weft"]);
        Self::from_arg_matches(&matches).expect("every flag has a default or is optional")
    }
}

/// A section of flags a task brings (clap's group, serialised under the flags' names).
pub trait Section:
    clap::Args + clap::FromArgMatches + Clone + std::fmt::Debug + serde::Serialize + Send + Sync
{
}

impl<S> Section for S where
    S: clap::Args + clap::FromArgMatches + Clone + std::fmt::Debug + serde::Serialize + Send + Sync
{
}

/// A trainer's task: its own sections, and its defaults for the shared sections' flags whose
/// defaults differ between tasks. The defaults are the flags' value strings: clap's
/// `default_value_t` keeps its rendering in one `static` shared by every instantiation of a
/// generic section, so the first task's command built would set every task's default.
pub trait TaskDefaults: Clone + std::fmt::Debug + Send + Sync + 'static {
    /// The "Model" section.
    type Model: Section;
    /// The "Data" section.
    type Data: Section;
    /// `--batch-size`: the global batch.
    const BATCH_SIZE: &'static str;
    /// `--epochs`.
    const EPOCHS: &'static str;
    /// `--optimizer`, as its value name.
    const OPTIMIZER: &'static str;
    /// `--lr`.
    const LR: &'static str;
    /// `--weight-decay`.
    const WEIGHT_DECAY: &'static str;
    /// `--warmup-steps` when not given, for a run of `total_steps`.
    fn warmup_steps(total_steps: usize) -> usize;
}

#[cfg(test)]
mod tests {
    use clap::{FromArgMatches, Parser, Subcommand};

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Trainer,
    }

    #[derive(Subcommand)]
    enum Trainer {
        TrainResnet(RunArgs<ResnetDefaults>),
        TrainGpt(RunArgs<GptDefaults>),
    }

    fn parse(argv: &[&str]) -> Trainer {
        let matches = <Cli as clap::CommandFactory>::command().get_matches_from(argv);
        Cli::from_arg_matches(&matches).unwrap().command
    }

    /// A run built from values starts from the flags' defaults, its task's.
    #[test]
    fn default_values_are_the_flags_defaults() {
        let gpt = RunArgs::<GptDefaults>::default();
        assert_eq!((gpt.training.batch_size, gpt.optim.lr), (32, 3e-3));
        assert_eq!(
            (gpt.model.model_name(), gpt.model.model),
            ("gpt-tiny".into(), None)
        );
        let resnet = RunArgs::<ResnetDefaults>::default();
        assert_eq!((resnet.training.batch_size, resnet.optim.lr), (64, 0.1));
        assert_eq!(resnet.checkpoints.save_timeout, 1800.0);
    }

    /// Both trainers in one command (as `weft` and xtask build them): each keeps its own
    /// defaults, whichever is built first.
    #[test]
    fn each_trainer_keeps_its_defaults_beside_the_other() {
        for _ in 0..2 {
            let Trainer::TrainGpt(gpt) = parse(&["weft", "train-gpt"]) else {
                panic!("train-gpt parsed as another trainer");
            };
            assert_eq!(gpt.training.batch_size, 32);
            assert_eq!(gpt.training.epochs, 1);
            assert_eq!(gpt.optim.optimizer, OptimizerKind::Adamw);
            assert_eq!(gpt.optim.lr, 3e-3);
            assert_eq!(gpt.optim.weight_decay, 0.1);
            let Trainer::TrainResnet(resnet) = parse(&["weft", "train-resnet"]) else {
                panic!("train-resnet parsed as another trainer");
            };
            assert_eq!(resnet.training.batch_size, 64);
            assert_eq!(resnet.training.epochs, 2);
            assert_eq!(resnet.optim.optimizer, OptimizerKind::Sgd);
            assert_eq!(resnet.optim.lr, 0.1);
            assert_eq!(resnet.optim.weight_decay, 5e-4);
        }
    }
}
