//! SGD and AdamW with exactly PyTorch's update rules, operating over flat buffers (one fused
//! loop over a contiguous slice), plus LR schedules.
//!
//! The optimizers update `&mut [f32]` (or `f64`) parameters from `&[f32]` gradients and keep
//! their state as flat buffers of the same length, created at the first step. Every update is
//! element-wise, so a sharded (ZeRO) optimizer can run the same step over just its shard of
//! the flat buffer (with [`ParamGroups::restricted_to`] for per-range hyperparameters), and a
//! mixed-precision layer can own fp32 master weights and hand them to [`Optimizer::step`].
//! Large buffers are updated in parallel chunks on scoped threads; results do not depend on
//! the chunking.
//!
//! [`ModelOptimizer`] runs them over a model's flat buffers on the parameters' device, over
//! the range of the buffers a rank owns: the CPU loop over a flat master copy, or (feature
//! `cuda`) `DeviceOptimizer`'s multi-tensor CUDA kernels, the same rules with the learning
//! rate and step count on the device (capturable in a CUDA graph). Its state is readable and
//! writable by parameter name ([`NamedState`]) for checkpoints.

mod adamw;
mod adamw_kernel;
mod chunked;
#[cfg(feature = "cuda")]
mod device;
mod error;
mod groups;
mod host_optimizer;
mod model_optimizer;
mod named_state;
mod optimizer;
mod real;
mod schedule;
mod schedule_name;
mod sgd;
mod state;
mod update_parts;
mod validate;

pub use adamw::{AdamW, AdamWConfig};
#[cfg(feature = "cuda")]
pub use device::{DeviceOptimizer, DeviceRule, MASTER_WEIGHTS};
pub use error::OptimError;
pub use groups::{ParamGroup, ParamGroups};
pub use host_optimizer::HostOptimizer;
pub use model_optimizer::{ModelOptimizer, OptimizerConfig};
pub use named_state::{FlatState, NamedState, NamedStateEntry};
pub use optimizer::{Optimizer, Shard};
pub use real::Real;
pub use schedule::{Constant, CosineAnnealing, LinearWarmup, LrSchedule, MultiStepLr, StepLr};
pub use schedule_name::{schedule_from_name, ScheduleParams, SCHEDULE_NAMES};
pub use sgd::{Sgd, SgdConfig};
pub use state::OptimizerState;
