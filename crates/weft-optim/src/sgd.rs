//! Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay,
//! following `torch.optim.SGD` (foreach=False) exactly.

use crate::chunked::{run_chunked, Lanes};
use crate::optimizer::check_step_lengths;
use crate::{validate, OptimError, Optimizer, OptimizerState, ParamGroups, Real, Shard};

const NAME: &str = "sgd";
const MOMENTUM_BUFFER: &str = "momentum_buffer";

/// Hyperparameters of [`Sgd`], named and defaulted as in `torch.optim.SGD`.
#[derive(Debug, Clone, PartialEq)]
pub struct SgdConfig {
    pub lr: f64,
    pub momentum: f64,
    pub dampening: f64,
    /// L2 penalty added to the gradient: `g + weight_decay * p`.
    pub weight_decay: f64,
    pub nesterov: bool,
    /// Ascend instead of descend (the gradient is negated).
    pub maximize: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            maximize: false,
        }
    }
}

impl SgdConfig {
    fn validate(&self) -> Result<(), OptimError> {
        validate::non_negative(NAME, "lr", self.lr)?;
        validate::non_negative(NAME, "momentum", self.momentum)?;
        validate::finite(NAME, "dampening", self.dampening)?;
        validate::non_negative(NAME, "weight_decay", self.weight_decay)?;
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(OptimError::InvalidNesterov {
                momentum: self.momentum,
                dampening: self.dampening,
            });
        }
        Ok(())
    }
}

/// SGD over a flat buffer. Per step, for each element (PyTorch's rule):
/// `g = grad (negated if maximize) + wd * p`; with momentum, `buf = g` on the first step and
/// `buf = momentum * buf + (1 - dampening) * g` after; then `g = g + momentum * buf` (Nesterov)
/// or `g = buf`; finally `p -= lr * g`.
#[derive(Debug, Clone)]
pub struct Sgd<T: Real = f32> {
    config: SgdConfig,
    groups: ParamGroups,
    step: u64,
    momentum_buffer: Option<Vec<T>>,
}

impl<T: Real> Sgd<T> {
    pub fn new(config: SgdConfig) -> Result<Self, OptimError> {
        config.validate()?;
        Ok(Self {
            config,
            groups: ParamGroups::default(),
            step: 0,
            momentum_buffer: None,
        })
    }

    /// Uses `groups` for per-range weight decay and lr scale (see [`ParamGroups`]).
    pub fn with_param_groups(mut self, groups: ParamGroups) -> Self {
        self.groups = groups;
        self
    }

    pub fn config(&self) -> &SgdConfig {
        &self.config
    }

    fn buffer_names(&self) -> &'static [&'static str] {
        if self.config.momentum != 0.0 {
            &[MOMENTUM_BUFFER]
        } else {
            &[]
        }
    }
}

impl<T: Real> Optimizer<T> for Sgd<T> {
    fn step_at(&mut self, shard: Shard, params: &mut [T], grads: &[T]) -> Result<(), OptimError> {
        let state_lens: Vec<_> = self
            .momentum_buffer
            .iter()
            .map(|buf| (MOMENTUM_BUFFER, buf.len()))
            .collect();
        check_step_lengths(NAME, params.len(), grads.len(), &state_lens)?;
        let segments = self
            .groups
            .segments_at(shard, params.len(), self.config.weight_decay)?;
        let first_step = self.momentum_buffer.is_none();
        if self.config.momentum != 0.0 && first_step {
            self.momentum_buffer = Some(vec![T::ZERO; params.len()]);
        }
        for segment in segments {
            let range = segment.range;
            let scalars = SgdScalars {
                neg_lr: T::from_f64(-(self.config.lr * segment.lr_scale)),
                weight_decay: (segment.weight_decay != 0.0)
                    .then(|| T::from_f64(segment.weight_decay)),
                momentum: T::from_f64(self.config.momentum),
                one_minus_dampening: T::from_f64(1.0 - self.config.dampening),
                nesterov: self.config.nesterov,
                maximize: self.config.maximize,
                first_step,
            };
            let lanes = SgdLanes {
                params: &mut params[range.clone()],
                grads: &grads[range.clone()],
                momentum_buffer: self
                    .momentum_buffer
                    .as_deref_mut()
                    .map(|buf| &mut buf[range]),
            };
            run_chunked(lanes, |lanes| update(lanes, &scalars));
        }
        self.step += 1;
        Ok(())
    }

    fn lr(&self) -> f64 {
        self.config.lr
    }

    fn set_lr(&mut self, lr: f64) -> Result<(), OptimError> {
        validate::non_negative(NAME, "lr", lr)?;
        self.config.lr = lr;
        Ok(())
    }

    fn step_count(&self) -> u64 {
        self.step
    }

    fn state_len(&self) -> usize {
        self.momentum_buffer.as_ref().map_or(0, Vec::len)
    }

    fn state(&self) -> OptimizerState<T> {
        OptimizerState::new(
            NAME,
            self.step,
            self.momentum_buffer
                .iter()
                .map(|buf| (MOMENTUM_BUFFER, buf)),
        )
    }

    fn load_state(&mut self, state: OptimizerState<T>) -> Result<(), OptimError> {
        let step = state.step;
        let buffers = state.into_buffers(NAME, self.buffer_names())?;
        self.momentum_buffer = buffers.and_then(|buffers| buffers.into_iter().next());
        self.step = step;
        Ok(())
    }
}

/// Per-segment scalars, converted to the element type once per step.
struct SgdScalars<T> {
    neg_lr: T,
    weight_decay: Option<T>,
    momentum: T,
    one_minus_dampening: T,
    nesterov: bool,
    maximize: bool,
    first_step: bool,
}

/// One segment's (or chunk's) equally long parameter, gradient and momentum buffers.
struct SgdLanes<'a, T> {
    params: &'a mut [T],
    grads: &'a [T],
    momentum_buffer: Option<&'a mut [T]>,
}

impl<T: Real> Lanes for SgdLanes<'_, T> {
    fn len(&self) -> usize {
        self.params.len()
    }

    fn split_at(self, mid: usize) -> (Self, Self) {
        let (params_head, params_tail) = self.params.split_at_mut(mid);
        let (grads_head, grads_tail) = self.grads.split_at(mid);
        let (buf_head, buf_tail) = match self.momentum_buffer.map(|buf| buf.split_at_mut(mid)) {
            Some((head, tail)) => (Some(head), Some(tail)),
            None => (None, None),
        };
        (
            SgdLanes {
                params: params_head,
                grads: grads_head,
                momentum_buffer: buf_head,
            },
            SgdLanes {
                params: params_tail,
                grads: grads_tail,
                momentum_buffer: buf_tail,
            },
        )
    }
}

fn update<T: Real>(lanes: SgdLanes<'_, T>, s: &SgdScalars<T>) {
    let decayed_grad = |grad: T, param: T| {
        let grad = if s.maximize { -grad } else { grad };
        match s.weight_decay {
            Some(weight_decay) => grad + weight_decay * param,
            None => grad,
        }
    };
    let params_grads = lanes.params.iter_mut().zip(lanes.grads);
    match lanes.momentum_buffer {
        None => {
            for (param, &grad) in params_grads {
                *param = *param + s.neg_lr * decayed_grad(grad, *param);
            }
        }
        Some(momentum_buffer) => {
            for ((param, &grad), buf) in params_grads.zip(momentum_buffer) {
                let grad = decayed_grad(grad, *param);
                *buf = if s.first_step {
                    grad
                } else {
                    *buf * s.momentum + s.one_minus_dampening * grad
                };
                let direction = if s.nesterov {
                    grad + s.momentum * *buf
                } else {
                    *buf
                };
                *param = *param + s.neg_lr * direction;
            }
        }
    }
}
