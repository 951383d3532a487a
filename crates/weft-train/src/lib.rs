//! weft-train: trainers composed from the weft crates.
//!
//! [`resnet::run`] is the image-classification trainer behind `cargo xtask train-resnet`;
//! [`step::Trainer`] is its optimizer step (block-wise forward/backward into flat gradients,
//! one fused optimizer update over flat parameters), reused by the benchmarks.

pub mod args;
#[cfg(feature = "cuda")]
mod cuda_graph;
pub mod data;
pub mod device;
pub mod distributed;
mod flat_optimizer;
pub mod optim_setup;
pub mod progress;
pub mod resnet;
pub mod run_dir;
pub mod step;

pub use args::TrainArgs;
