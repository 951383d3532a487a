//! [`update_loss_scale`]: the dynamic loss scaler's rule applied to its state where the
//! gradients live (torch.amp.GradScaler's `_amp_update_scale_`), so that a step can scale its
//! loss, undo the scale ([`super::unscale_and_check_by`]), decide to skip and update the scale
//! without reading anything on the host, and a CUDA graph can capture it. CPU: the same rule on
//! the host; CUDA: one thread (`kernels/unscale.cu`).

use candle_core::{bail, DType, Result, Tensor};

/// Elements of a scaler's state: `[scale, growth tracker, skipped steps, found]`, f64.
pub const LOSS_SCALE_STATE_LEN: usize = 4;

/// How the scale moves: `(growth factor, backoff factor, growth interval)`.
pub type ScaleRule = (f64, f64, u64);

/// Applies one step's outcome to `state` (f64, [`LOSS_SCALE_STATE_LEN`] elements:
/// `[scale, growth tracker, skipped steps, found]`) in place, from the f32 flag `found` (1 if
/// any gradient of any rank was inf or NaN): an overflow multiplies the scale by the backoff
/// factor, resets the tracker and counts a skipped step; a clean step counts in the tracker and,
/// at the growth interval, multiplies the scale by the growth factor (if it stays finite) and
/// restarts the tracker. `state[3]` records whether this step was skipped.
pub fn update_loss_scale(state: &Tensor, found: &Tensor, rule: ScaleRule) -> Result<()> {
    if state.dtype() != DType::F64 || state.dims() != [LOSS_SCALE_STATE_LEN] {
        bail!(
            "update_loss_scale: the state must be {LOSS_SCALE_STATE_LEN} f64, got {:?} {:?}",
            state.dims(),
            state.dtype()
        );
    }
    if found.dtype() != DType::F32 || found.elem_count() != 1 {
        bail!("update_loss_scale: the flag must be one f32");
    }
    if !state.device().same_device(found.device()) || !state.is_contiguous() {
        bail!("update_loss_scale: the state must be contiguous, on the flag's device");
    }
    let (growth, backoff, interval) = rule;
    if state.device().is_cpu() {
        let mut s = state.to_vec1::<f64>()?;
        let found = found.flatten_all()?.to_vec1::<f32>()?[0] != 0.0;
        next_state(&mut s, found, rule);
        return state.slice_set(&Tensor::new(s, state.device())?, 0, 0);
    }
    #[cfg(feature = "cuda")]
    return super::unscale_cuda::update_scale(state, found, (growth, backoff, interval as f64));
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (growth, backoff, interval);
        bail!("update_loss_scale: a device without kernels")
    }
}

/// The rule on a host copy of the state (the CPU twin of `loss_scale_update`).
fn next_state(s: &mut [f64], found: bool, (growth, backoff, interval): ScaleRule) {
    if found {
        s[0] *= backoff;
        s[1] = 0.0;
        s[2] += 1.0;
        s[3] = 1.0;
        return;
    }
    s[1] += 1.0;
    if s[1] == interval as f64 {
        let grown = s[0] * growth;
        if grown.is_finite() {
            s[0] = grown;
        }
        s[1] = 0.0;
    }
    s[3] = 0.0;
}
