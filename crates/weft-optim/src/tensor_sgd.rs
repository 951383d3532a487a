//! [`TensorSgd`]: the update of [`crate::Sgd`] on candle tensors, on whatever device they live
//! (a GPU's parameters and momentum never leave it): either on a flat parameter tensor
//! ([`TensorSgd::step`], a handful of element-wise tensor operations), or in place on the
//! model's own parameter tensors with their gradients in a flat buffer
//! ([`TensorSgd::step_tensors`]: one fused kernel launch per 48 parameters on CUDA). Param
//! groups become per-element weight-decay and lr-scale tensors, built once.

use candle_core::{DType, Tensor};
use weft_tensor::ops::{copy_tensors, sgd_tensors, SgdStep};

use crate::{validate, OptimError, OptimizerState, ParamGroups, SgdConfig};

const NAME: &str = "sgd";
const MOMENTUM_BUFFER: &str = "momentum_buffer";

fn tensor_error(e: candle_core::Error) -> OptimError {
    OptimError::Tensor {
        optimizer: NAME,
        reason: e.to_string(),
    }
}

/// Weight decay and lr scale: one value for the whole buffer, or one per element.
enum Coefficients {
    Uniform {
        weight_decay: f64,
        lr_scale: f64,
    },
    PerElement {
        weight_decay: Tensor,
        lr_scale: Tensor,
    },
}

/// SGD with momentum, dampening, Nesterov momentum and weight decay over a flat tensor, with
/// the same rule as [`crate::Sgd`] (`torch.optim.SGD`).
pub struct TensorSgd {
    config: SgdConfig,
    groups: ParamGroups,
    step: u64,
    momentum_buffer: Option<Tensor>,
    coefficients: Option<Coefficients>,
    /// The learning rate as one element beside the parameters (for [`Self::step_tensors`]),
    /// rewritten by [`Self::set_lr`]: a step captured in a CUDA graph reads it at each replay.
    lr_value: Option<Tensor>,
}

impl TensorSgd {
    pub fn new(config: SgdConfig) -> Result<Self, OptimError> {
        // The slice optimizer validates the same configuration.
        crate::Sgd::<f32>::new(config.clone())?;
        Ok(Self {
            config,
            groups: ParamGroups::default(),
            step: 0,
            momentum_buffer: None,
            coefficients: None,
            lr_value: None,
        })
    }

    /// Uses `groups` for per-range weight decay and lr scale (see [`ParamGroups`]).
    pub fn with_param_groups(mut self, groups: ParamGroups) -> Self {
        self.groups = groups;
        self.coefficients = None;
        self
    }

    pub fn lr(&self) -> f64 {
        self.config.lr
    }

    /// Sets the base learning rate; it must be finite and `>= 0`. With parameters on a GPU
    /// this writes the device copy of the rate (call it outside a CUDA graph capture).
    pub fn set_lr(&mut self, lr: f64) -> Result<(), OptimError> {
        validate::non_negative(NAME, "lr", lr)?;
        self.config.lr = lr;
        if let Some(value) = &self.lr_value {
            write_scalar(value, lr).map_err(tensor_error)?;
        }
        Ok(())
    }

    /// The device copy of the learning rate, made beside `like` on first use.
    fn lr_value(&mut self, like: &Tensor) -> Result<Tensor, OptimError> {
        if self.lr_value.is_none() {
            let value = Tensor::full(self.config.lr, 1, like.device())
                .and_then(|t| t.to_dtype(like.dtype()))
                .map_err(tensor_error)?;
            self.lr_value = Some(value);
        }
        Ok(self.lr_value.clone().expect("just made"))
    }

    pub fn step_count(&self) -> u64 {
        self.step
    }

    fn coefficients(&mut self, params: &Tensor) -> Result<&Coefficients, OptimError> {
        if self.coefficients.is_none() {
            let len = params.elem_count();
            let segments = self.groups.segments(len, self.config.weight_decay)?;
            let uniform = segments.windows(2).all(|pair| {
                pair[0].weight_decay == pair[1].weight_decay && pair[0].lr_scale == pair[1].lr_scale
            });
            let coefficients = if uniform {
                Coefficients::Uniform {
                    weight_decay: segments
                        .first()
                        .map_or(self.config.weight_decay, |s| s.weight_decay),
                    lr_scale: segments.first().map_or(1.0, |s| s.lr_scale),
                }
            } else {
                let mut weight_decay = Vec::with_capacity(len);
                let mut lr_scale = Vec::with_capacity(len);
                for segment in &segments {
                    weight_decay.resize(segment.range.end, segment.weight_decay);
                    lr_scale.resize(segment.range.end, segment.lr_scale);
                }
                let make = |values: Vec<f64>| {
                    Tensor::from_vec(values, len, params.device())
                        .and_then(|t| t.to_dtype(params.dtype()))
                        .map_err(tensor_error)
                };
                Coefficients::PerElement {
                    weight_decay: make(weight_decay)?,
                    lr_scale: make(lr_scale)?,
                }
            };
            self.coefficients = Some(coefficients);
        }
        Ok(self.coefficients.as_ref().expect("just built"))
    }

    /// One update of the flat `params` with `grads` (same length, dtype and device); returns
    /// the new parameters. On error nothing (state, step count) is modified.
    pub fn step(&mut self, params: &Tensor, grads: &Tensor) -> Result<Tensor, OptimError> {
        if params.elem_count() != grads.elem_count() {
            return Err(OptimError::LengthMismatch {
                params: params.elem_count(),
                grads: grads.elem_count(),
            });
        }
        if let Some(buffer) = &self.momentum_buffer {
            if buffer.elem_count() != params.elem_count() {
                return Err(OptimError::StateLengthMismatch {
                    optimizer: NAME,
                    buffer: MOMENTUM_BUFFER,
                    state: buffer.elem_count(),
                    params: params.elem_count(),
                });
            }
        }
        let config = self.config.clone();
        let momentum_buffer = self.momentum_buffer.clone();
        let coefficients = self.coefficients(params)?;
        let (new_params, new_buffer) = update(
            &config,
            coefficients,
            params,
            grads,
            momentum_buffer.as_ref(),
        )
        .map_err(tensor_error)?;
        self.momentum_buffer = new_buffer;
        self.step += 1;
        Ok(new_params)
    }

    /// One update of the parameter tensors `params` in place; parameter `i`'s gradient is the
    /// elements `offsets[i]..offsets[i] + numel` of the flat `grads`. With uniform weight decay
    /// and lr scale this is [`sgd_tensors`] (fused; no temporaries); per-element param groups
    /// gather the parameters, update them as one flat tensor and write them back. On error
    /// nothing (state, step count) is modified.
    pub fn step_tensors(
        &mut self,
        params: &[&Tensor],
        offsets: &[usize],
        grads: &Tensor,
    ) -> Result<(), OptimError> {
        let len = grads.elem_count();
        if let Some(buffer) = &self.momentum_buffer {
            if buffer.elem_count() != len {
                return Err(OptimError::StateLengthMismatch {
                    optimizer: NAME,
                    buffer: MOMENTUM_BUFFER,
                    state: buffer.elem_count(),
                    params: len,
                });
            }
        }
        let uniform = match self.coefficients(grads)? {
            Coefficients::Uniform {
                weight_decay,
                lr_scale,
            } => Some((*weight_decay, *lr_scale)),
            Coefficients::PerElement { .. } => None,
        };
        let Some((weight_decay, lr_scale)) = uniform else {
            return self.step_gathered(params, offsets, grads);
        };
        let first_step = self.momentum_buffer.is_none();
        let buffer = match (&self.momentum_buffer, self.config.momentum != 0.0) {
            (Some(buffer), _) => buffer.clone(),
            (None, true) => grads.zeros_like().map_err(tensor_error)?,
            // Never read or written without momentum.
            (None, false) => grads.clone(),
        };
        let lr = self.lr_value(grads)?;
        let step = SgdStep {
            lr_scale,
            momentum: self.config.momentum,
            dampening: self.config.dampening,
            weight_decay,
            nesterov: self.config.nesterov,
            maximize: self.config.maximize,
            first_step,
        };
        sgd_tensors(params, offsets, grads, &buffer, &lr, &step).map_err(tensor_error)?;
        if self.config.momentum != 0.0 {
            self.momentum_buffer = Some(buffer);
        }
        self.step += 1;
        Ok(())
    }

    /// [`Self::step_tensors`] through a flat copy of the parameters.
    fn step_gathered(
        &mut self,
        params: &[&Tensor],
        offsets: &[usize],
        grads: &Tensor,
    ) -> Result<(), OptimError> {
        let mut order: Vec<usize> = (0..params.len()).collect();
        order.sort_by_key(|&i| offsets[i]);
        let flat: Vec<Tensor> = order
            .iter()
            .map(|&i| params[i].flatten_all())
            .collect::<candle_core::Result<_>>()
            .map_err(tensor_error)?;
        let gathered = Tensor::cat(&flat, 0).map_err(tensor_error)?;
        let updated = self.step(&gathered, grads)?;
        let views: Vec<Tensor> = params
            .iter()
            .zip(offsets)
            .map(|(p, &offset)| updated.narrow(0, offset, p.elem_count()))
            .collect::<candle_core::Result<_>>()
            .map_err(tensor_error)?;
        let pairs: Vec<(&Tensor, &Tensor)> = views.iter().zip(params.iter().copied()).collect();
        copy_tensors(&pairs).map_err(tensor_error)
    }

    /// The state as host vectors (f32), for checkpoints: the same layout as [`crate::Sgd`]'s.
    pub fn state(&self) -> Result<OptimizerState<f32>, OptimError> {
        let buffer = match &self.momentum_buffer {
            Some(t) => Some(
                t.to_dtype(DType::F32)
                    .and_then(|t| t.flatten_all()?.to_vec1::<f32>())
                    .map_err(tensor_error)?,
            ),
            None => None,
        };
        Ok(OptimizerState::new(
            NAME,
            self.step,
            buffer.iter().map(|b| (MOMENTUM_BUFFER, b)),
        ))
    }
}

/// Overwrites the one element of `t` with `value`, on the tensor's device.
fn write_scalar(t: &Tensor, value: f64) -> candle_core::Result<()> {
    let fresh = Tensor::full(value, 1, t.device())?.to_dtype(t.dtype())?;
    t.slice_set(&fresh, 0, 0)
}

/// `g = ±grad + wd·p`; with momentum `buf = g` (first step) or `momentum·buf + (1 − dampening)·g`,
/// then `g = g + momentum·buf` (Nesterov) or `buf`; finally `p − lr·scale·g`.
fn update(
    config: &SgdConfig,
    coefficients: &Coefficients,
    params: &Tensor,
    grads: &Tensor,
    momentum_buffer: Option<&Tensor>,
) -> candle_core::Result<(Tensor, Option<Tensor>)> {
    let params = params.flatten_all()?;
    let mut g = grads.flatten_all()?;
    if config.maximize {
        g = g.neg()?;
    }
    g = match coefficients {
        Coefficients::Uniform { weight_decay, .. } if *weight_decay != 0.0 => {
            (g + params.affine(*weight_decay, 0.0)?)?
        }
        Coefficients::Uniform { .. } => g,
        Coefficients::PerElement { weight_decay, .. } => (g + (&params * weight_decay)?)?,
    };
    let mut new_buffer = None;
    if config.momentum != 0.0 {
        let buffer = match momentum_buffer {
            None => g.copy()?,
            Some(buf) => {
                (buf.affine(config.momentum, 0.0)? + g.affine(1.0 - config.dampening, 0.0)?)?
            }
        };
        g = if config.nesterov {
            (g + buffer.affine(config.momentum, 0.0)?)?
        } else {
            buffer.clone()
        };
        new_buffer = Some(buffer);
    }
    let step = match coefficients {
        Coefficients::Uniform { lr_scale, .. } => g.affine(config.lr * lr_scale, 0.0)?,
        Coefficients::PerElement { lr_scale, .. } => (&g * lr_scale)?.affine(config.lr, 0.0)?,
    };
    Ok((params.sub(&step)?, new_buffer))
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;
    use crate::{Optimizer, ParamGroup, Sgd};

    fn values(len: usize, seed: u64) -> Vec<f64> {
        (0..len)
            .map(|i| (((i as u64 * 2654435761 + seed * 97) % 1000) as f64 / 500.0) - 1.0)
            .collect()
    }

    fn configs() -> Vec<SgdConfig> {
        let base = SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 1e-2,
            ..SgdConfig::default()
        };
        vec![
            SgdConfig {
                momentum: 0.0,
                ..base.clone()
            },
            base.clone(),
            SgdConfig {
                dampening: 0.3,
                maximize: true,
                ..base.clone()
            },
            SgdConfig {
                nesterov: true,
                ..base
            },
        ]
    }

    /// Five steps of the tensor optimizer equal five steps of the slice optimizer in f64,
    /// with and without param groups, for plain, momentum, dampened-maximising and Nesterov
    /// SGD. Both compute the same operations in the same order; the tolerance only allows
    /// for a different rounding of `p − lr·g` (fused or not).
    #[test]
    fn matches_the_slice_optimizer() {
        let len = 37;
        let groups = ParamGroups::new(vec![ParamGroup {
            range: 5..20,
            weight_decay: 0.0,
            lr_scale: 0.5,
        }])
        .unwrap();
        for config in configs() {
            for grouped in [false, true] {
                let mut slice = Sgd::<f64>::new(config.clone()).unwrap();
                let mut tensor = TensorSgd::new(config.clone()).unwrap();
                if grouped {
                    slice = slice.with_param_groups(groups.clone());
                    tensor = tensor.with_param_groups(groups.clone());
                }
                let mut expected = values(len, 1);
                let mut params = Tensor::from_vec(expected.clone(), len, &Device::Cpu).unwrap();
                for step in 0..5 {
                    let grads = values(len, 10 + step);
                    slice.step(&mut expected, &grads).unwrap();
                    let g = Tensor::from_vec(grads, len, &Device::Cpu).unwrap();
                    params = tensor.step(&params, &g).unwrap();
                }
                let got = params.to_vec1::<f64>().unwrap();
                for (i, (a, b)) in got.iter().zip(&expected).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-12 * b.abs().max(1.0),
                        "{config:?} grouped {grouped}: element {i} is {a}, expected {b}"
                    );
                }
                assert_eq!(tensor.step_count(), 5);
                let state = tensor.state().unwrap();
                assert_eq!(state.buffers.len(), usize::from(config.momentum != 0.0));
            }
        }
    }

    #[test]
    fn mismatched_lengths_are_errors_and_change_nothing() {
        let mut opt = TensorSgd::new(SgdConfig::default()).unwrap();
        let params = Tensor::zeros(4, DType::F32, &Device::Cpu).unwrap();
        let grads = Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap();
        assert!(matches!(
            opt.step(&params, &grads),
            Err(OptimError::LengthMismatch {
                params: 4,
                grads: 3
            })
        ));
        assert_eq!(opt.step_count(), 0);
        assert!(opt.set_lr(-1.0).is_err());
    }
}
