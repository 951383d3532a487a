//! weft-train: trainers composed from the weft crates.
//!
//! [`resnet::run`] is the image-classification trainer behind `cargo xtask train-resnet`,
//! [`gpt::run`] the language-model trainer behind `cargo xtask train-gpt`; the
//! training step itself is weft-parallel's [`weft_parallel::Trainer`], set up per model by
//! [`parallelize`]. [`memory_plan`] predicts a run's memory per rank (`cargo xtask memory-plan`).

pub mod args;
mod checkpoint_write;
pub mod config_file;
pub mod data;
pub mod device;
pub mod distributed;
pub mod divergence;
pub mod fit;
pub mod flags;
pub mod gpt;
pub mod gpt_args;
pub mod gpt_checkpoint;
mod gpt_checkpoint_resplit;
pub mod gpt_data;
pub mod gpt_parallel;
mod gpt_parts;
pub mod gpt_pipeline;
pub mod language_model;
pub mod llama_parallel;
pub mod logging;
pub mod memory_plan;
pub mod memory_report;
pub mod optim_setup;
pub mod parallelize;
pub mod progress;
pub mod resnet;
mod resnet_parts;
pub mod resume;
pub mod resume_config;
pub mod run_checkpoints;
pub mod run_dir;
pub mod step_engine;
mod step_report;
pub mod tasks;
pub mod tp_split;
pub mod traces;

pub use args::TrainArgs;
pub use gpt_args::GptArgs;
