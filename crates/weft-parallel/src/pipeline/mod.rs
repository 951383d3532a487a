//! Pipeline parallelism: a model's blocks split into stages on different ranks
//! ([`partition`]: balanced by a weight per block, or as given), micro-batches in flight
//! between them. Schedules are plans — per stage the ordered actions of one step
//! ([`Action`]: forward or backward of a micro-batch, send or receive of an activation or a
//! gradient), generated before the step ([`Plan::new`] for GPipe, 1F1B and forward-only) and
//! checked ([`check_complete`], [`simulate`]: complete, deadlock-free, and the bubble they leave).
//! The plan format has room for interleaved and zero-bubble schedules (more action kinds: a
//! backward split into its input-gradient and weight-gradient parts), which come later.
//!
//! Execution: each stage is a [`crate::Trainer`] of its blocks whose strategy is a
//! [`PipelineStage`] (the stage's own data/tensor parallelism inside; the tied token table summed
//! between the first and last stage; norm and found-inf over all stages), driven by a
//! [`PipelineTrainer`] that runs the stage's actions of the plan over [`StageLinks`] (a
//! communicator per boundary and direction) and measures the stage's bubble and the activations
//! it holds.

mod action;
mod block_times;
mod check;
mod evaluate;
mod execute;
mod links;
pub mod partition;
mod schedule;
mod stage_step;
mod stage_strategy;

pub use action::{Action, StageAction};
pub use block_times::measured_block_times;
pub use check::{check_complete, simulate, PlanError, Simulation};
pub use execute::{PipelineStepOutcome, PipelineTrainer};
pub use links::StageLinks;
pub use schedule::{theoretical_bubble, Plan, ScheduleKind};
pub use stage_strategy::PipelineStage;

#[cfg(test)]
mod tests;
