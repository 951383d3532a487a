//! [`ScaleOnDevice`]: a [`DynamicLossScaler`]'s state kept where the gradients are, so that a
//! training step scales its loss, undoes the scale, finds inf/NaN, decides to skip and moves the
//! scale without the host reading anything mid-step (a CUDA graph captures all of it, as
//! PyTorch's GradScaler with fused optimizers and `found_inf` does). The host reads the state
//! after the step, for the logs and for checkpoints.

use std::ops::Range;

use candle_core::{DType, Device, Tensor};
use weft_tensor::ops::{update_loss_scale, ScaleRule};

use crate::error::PrecisionError;
use crate::scaler::{DynamicLossScaler, LossScalerState};

/// The scaler's state on a device: `[scale, growth tracker, skipped steps, found]` (f64), and
/// its rule.
#[derive(Debug)]
pub struct ScaleOnDevice {
    state: Tensor,
    rule: ScaleRule,
}

impl ScaleOnDevice {
    /// `scaler`'s configuration and current state, put on `device`.
    pub fn new(scaler: &DynamicLossScaler, device: &Device) -> Result<Self, PrecisionError> {
        let s = scaler.state();
        let values = [
            s.scale,
            s.growth_tracker as f64,
            s.skipped_steps as f64,
            0.0,
        ];
        let config = scaler.config();
        Ok(Self {
            state: Tensor::new(&values, device)?,
            rule: (
                config.growth_factor,
                config.backoff_factor,
                config.growth_interval,
            ),
        })
    }

    /// The scale as a one-element tensor of `dtype` on the device (what a loss or an output
    /// gradient is multiplied by before backward).
    pub fn scale_as(&self, dtype: DType) -> Result<Tensor, PrecisionError> {
        Ok(self.state.narrow(0, 0, 1)?.to_dtype(dtype)?)
    }

    /// Divides `range` of the flat gradient buffer `grads` by the scale in place and returns
    /// the found-inf flag (one f32 on the device), as [`crate::unscale_and_check`] does.
    pub fn unscale_and_check(
        &self,
        grads: &Tensor,
        range: Range<usize>,
    ) -> Result<Tensor, PrecisionError> {
        Ok(weft_tensor::ops::unscale_and_check_by(
            grads,
            range,
            &self.state,
        )?)
    }

    /// Moves the scale by the step's flag (reduced over the ranks), on the device.
    pub fn update(&self, found: &Tensor) -> Result<(), PrecisionError> {
        Ok(update_loss_scale(&self.state, found, self.rule)?)
    }

    /// The state as the host sees it (waits for the device), and whether the last update was
    /// a skipped step.
    pub fn read(&self) -> Result<(LossScalerState, bool), PrecisionError> {
        let s = self.state.to_vec1::<f64>()?;
        let state = LossScalerState {
            scale: s[0],
            growth_tracker: s[1] as u64,
            skipped_steps: s[2] as u64,
        };
        Ok((state, s[3] != 0.0))
    }

    /// Overwrites the state (a checkpoint's), in place: tensors captured in a CUDA graph keep
    /// their address.
    pub fn load(&self, state: &LossScalerState) -> Result<(), PrecisionError> {
        let values = [
            state.scale,
            state.growth_tracker as f64,
            state.skipped_steps as f64,
            0.0,
        ];
        let fresh = Tensor::new(&values, self.state.device())?;
        Ok(self.state.slice_set(&fresh, 0, 0)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scaler::ScalerConfig;

    /// The device state follows the host scaler step for step, over growth and backoff, and
    /// reads and loads back.
    #[test]
    fn the_state_on_a_device_follows_the_host_scaler() {
        let config = ScalerConfig {
            growth_interval: 2,
            ..ScalerConfig::default()
        };
        let mut host = DynamicLossScaler::new(config).unwrap();
        let device = ScaleOnDevice::new(&host, &Device::Cpu).unwrap();
        for found in [false, false, true, false, false, false, true] {
            host.update(found);
            let flag = Tensor::new(&[f32::from(u8::from(found))], &Device::Cpu).unwrap();
            device.update(&flag).unwrap();
            let (state, skipped) = device.read().unwrap();
            assert_eq!(&state, host.state());
            assert_eq!(skipped, found);
        }
        let saved = LossScalerState {
            scale: 8.0,
            growth_tracker: 1,
            skipped_steps: 3,
        };
        device.load(&saved).unwrap();
        assert_eq!(device.read().unwrap(), (saved, false));
        let scale = device.scale_as(DType::F32).unwrap();
        assert_eq!(scale.to_vec1::<f32>().unwrap(), [8.0]);
    }
}
