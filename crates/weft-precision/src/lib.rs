//! weft-precision: how a training step uses 16-bit numbers.
//!
//! - [`policy`]: [`PrecisionPolicy`], the dtypes of the working copy of the parameters, of the
//!   computation, of the gradients' reduction, of the master weights and of the optimizer
//!   states; the presets `fp32`, `bf16-mixed`, `fp16-mixed` and `bf16-true`.
//! - [`scaler`]: [`DynamicLossScaler`], `torch.amp.GradScaler`'s dynamic loss scaling: the loss
//!   is multiplied by the scale before backward so that small fp16 gradients do not underflow,
//!   a step whose gradients hold an inf or NaN is skipped and the scale halved, and the scale
//!   doubles after a run of clean steps.
//! - [`unscale`]: dividing gradients by the scale and finding inf/NaN in the same pass.
//! - [`scale_on_device`]: [`ScaleOnDevice`], the scaler's state kept where the gradients are,
//!   so that a step needs no host read to scale, unscale, skip and move the scale.
//!
//! The master weights themselves are optimizer state (weft-optim keeps them beside the
//! moments, so ZeRO shards them together); the strategy of weft-parallel reduces the found-inf
//! flag over every rank holding part of the gradients, so that all ranks skip the same steps.

pub mod error;
pub mod policy;
pub mod scale_on_device;
pub mod scaler;
pub mod unscale;

pub use error::PrecisionError;
pub use policy::{PrecisionPolicy, PRESET_NAMES};
pub use scale_on_device::ScaleOnDevice;
pub use scaler::{DynamicLossScaler, LossScalerState, ScalerConfig, StepDecision};
pub use unscale::unscale_and_check;
