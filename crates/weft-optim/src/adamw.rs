//! Adam with decoupled weight decay (and optional AMSGrad), following `torch.optim.AdamW`
//! (foreach=False) exactly.

use crate::adamw_kernel::{update, AdamWLanes, AdamWScalars};
use crate::chunked::run_chunked;
use crate::optimizer::check_step_lengths;
use crate::{validate, OptimError, Optimizer, OptimizerState, ParamGroups, Real, Shard};

const NAME: &str = "adamw";
const EXP_AVG: &str = "exp_avg";
const EXP_AVG_SQ: &str = "exp_avg_sq";
const MAX_EXP_AVG_SQ: &str = "max_exp_avg_sq";

/// Hyperparameters of [`AdamW`], named and defaulted as in `torch.optim.AdamW`.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamWConfig {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    /// Decoupled decay: `p *= 1 - lr * weight_decay` before the Adam update.
    pub weight_decay: f64,
    pub amsgrad: bool,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 1e-2,
            amsgrad: false,
        }
    }
}

impl AdamWConfig {
    fn validate(&self) -> Result<(), OptimError> {
        validate::non_negative(NAME, "lr", self.lr)?;
        validate::unit_interval(NAME, "betas.0", self.betas.0)?;
        validate::unit_interval(NAME, "betas.1", self.betas.1)?;
        validate::non_negative(NAME, "eps", self.eps)?;
        validate::non_negative(NAME, "weight_decay", self.weight_decay)
    }
}

/// AdamW over a flat buffer. Per step `t` (from 1), for each element (PyTorch's rule):
/// `p *= 1 - lr * wd`; `m = lerp(m, g, 1 - b1)`; `v = b2 * v + (1 - b2) * g²`;
/// `denom = sqrt(v) / sqrt(1 - b2^t) + eps` (AMSGrad: the running max of `v` in place of `v`);
/// `p -= lr / (1 - b1^t) * m / denom`.
#[derive(Debug, Clone)]
pub struct AdamW<T: Real = f32> {
    config: AdamWConfig,
    groups: ParamGroups,
    step: u64,
    moments: Option<Moments<T>>,
}

#[derive(Debug, Clone)]
struct Moments<T> {
    exp_avg: Vec<T>,
    exp_avg_sq: Vec<T>,
    max_exp_avg_sq: Option<Vec<T>>,
}

impl<T: Real> AdamW<T> {
    pub fn new(config: AdamWConfig) -> Result<Self, OptimError> {
        config.validate()?;
        Ok(Self {
            config,
            groups: ParamGroups::default(),
            step: 0,
            moments: None,
        })
    }

    /// Uses `groups` for per-range weight decay and lr scale (see [`ParamGroups`]).
    pub fn with_param_groups(mut self, groups: ParamGroups) -> Self {
        self.groups = groups;
        self
    }

    pub fn config(&self) -> &AdamWConfig {
        &self.config
    }

    fn buffer_names(&self) -> &'static [&'static str] {
        if self.config.amsgrad {
            &[EXP_AVG, EXP_AVG_SQ, MAX_EXP_AVG_SQ]
        } else {
            &[EXP_AVG, EXP_AVG_SQ]
        }
    }

    fn named_buffers(&self) -> Vec<(&'static str, &Vec<T>)> {
        let Some(moments) = &self.moments else {
            return Vec::new();
        };
        let mut buffers = vec![
            (EXP_AVG, &moments.exp_avg),
            (EXP_AVG_SQ, &moments.exp_avg_sq),
        ];
        buffers.extend(
            moments
                .max_exp_avg_sq
                .iter()
                .map(|max| (MAX_EXP_AVG_SQ, max)),
        );
        buffers
    }
}

impl<T: Real> Optimizer<T> for AdamW<T> {
    fn step_at(&mut self, shard: Shard, params: &mut [T], grads: &[T]) -> Result<(), OptimError> {
        let state_lens: Vec<_> = self
            .named_buffers()
            .into_iter()
            .map(|(name, buf)| (name, buf.len()))
            .collect();
        check_step_lengths(NAME, params.len(), grads.len(), &state_lens)?;
        let segments = self
            .groups
            .segments_at(shard, params.len(), self.config.weight_decay)?;
        let len = params.len();
        let amsgrad = self.config.amsgrad;
        let moments = self.moments.get_or_insert_with(|| Moments {
            exp_avg: vec![T::ZERO; len],
            exp_avg_sq: vec![T::ZERO; len],
            max_exp_avg_sq: amsgrad.then(|| vec![T::ZERO; len]),
        });
        let step = (self.step + 1) as f64;
        let (beta1, beta2) = self.config.betas;
        let bias_correction1 = 1.0 - beta1.powf(step);
        let bias_correction2 = 1.0 - beta2.powf(step);
        for segment in segments {
            let range = segment.range;
            let lr = self.config.lr * segment.lr_scale;
            let scalars = AdamWScalars {
                decay: T::from_f64(1.0 - lr * segment.weight_decay),
                one_minus_beta1: T::from_f64(1.0 - beta1),
                beta2: T::from_f64(beta2),
                one_minus_beta2: T::from_f64(1.0 - beta2),
                bias_correction2_sqrt: T::from_f64(bias_correction2.sqrt()),
                eps: T::from_f64(self.config.eps),
                neg_step_size: T::from_f64(-(lr / bias_correction1)),
            };
            let lanes = AdamWLanes {
                params: &mut params[range.clone()],
                grads: &grads[range.clone()],
                exp_avg: &mut moments.exp_avg[range.clone()],
                exp_avg_sq: &mut moments.exp_avg_sq[range.clone()],
                max_exp_avg_sq: moments
                    .max_exp_avg_sq
                    .as_deref_mut()
                    .map(|max| &mut max[range]),
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
        self.named_buffers().iter().map(|(_, buf)| buf.len()).sum()
    }

    fn state(&self) -> OptimizerState<T> {
        OptimizerState::new(NAME, self.step, self.named_buffers())
    }

    fn load_state(&mut self, state: OptimizerState<T>) -> Result<(), OptimError> {
        let step = state.step;
        let buffers = state.into_buffers(NAME, self.buffer_names())?;
        self.moments = buffers.map(|buffers| {
            let mut buffers = buffers.into_iter();
            Moments {
                exp_avg: buffers.next().unwrap_or_default(),
                exp_avg_sq: buffers.next().unwrap_or_default(),
                max_exp_avg_sq: buffers.next(),
            }
        });
        self.step = step;
        Ok(())
    }
}
