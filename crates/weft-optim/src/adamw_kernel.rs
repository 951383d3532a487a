//! The fused AdamW update over one contiguous segment: decoupled decay, moment updates and
//! the parameter update in a single pass, with PyTorch's operation order.

use crate::chunked::Lanes;
use crate::Real;

/// Per-segment scalars, computed in f64 and converted to the element type once per step.
pub(crate) struct AdamWScalars<T> {
    /// `1 - lr * wd`; exactly 1 without weight decay, so multiplying by it is then a no-op.
    pub(crate) decay: T,
    pub(crate) one_minus_beta1: T,
    pub(crate) beta2: T,
    pub(crate) one_minus_beta2: T,
    pub(crate) bias_correction2_sqrt: T,
    pub(crate) eps: T,
    pub(crate) neg_step_size: T,
}

/// One segment's (or chunk's) equally long parameter, gradient and state buffers.
pub(crate) struct AdamWLanes<'a, T> {
    pub(crate) params: &'a mut [T],
    pub(crate) grads: &'a [T],
    pub(crate) exp_avg: &'a mut [T],
    pub(crate) exp_avg_sq: &'a mut [T],
    pub(crate) max_exp_avg_sq: Option<&'a mut [T]>,
}

impl<T: Real> Lanes for AdamWLanes<'_, T> {
    fn len(&self) -> usize {
        self.params.len()
    }

    fn split_at(self, mid: usize) -> (Self, Self) {
        let (params_head, params_tail) = self.params.split_at_mut(mid);
        let (grads_head, grads_tail) = self.grads.split_at(mid);
        let (avg_head, avg_tail) = self.exp_avg.split_at_mut(mid);
        let (sq_head, sq_tail) = self.exp_avg_sq.split_at_mut(mid);
        let (max_head, max_tail) = match self.max_exp_avg_sq.map(|max| max.split_at_mut(mid)) {
            Some((head, tail)) => (Some(head), Some(tail)),
            None => (None, None),
        };
        (
            AdamWLanes {
                params: params_head,
                grads: grads_head,
                exp_avg: avg_head,
                exp_avg_sq: sq_head,
                max_exp_avg_sq: max_head,
            },
            AdamWLanes {
                params: params_tail,
                grads: grads_tail,
                exp_avg: avg_tail,
                exp_avg_sq: sq_tail,
                max_exp_avg_sq: max_tail,
            },
        )
    }
}

/// `torch.lerp(start, end, weight)` as computed by PyTorch's kernel.
fn lerp<T: Real>(start: T, end: T, weight: T) -> T {
    if weight < T::from_f64(0.5) && weight > T::from_f64(-0.5) {
        start + weight * (end - start)
    } else {
        end - (end - start) * (T::from_f64(1.0) - weight)
    }
}

pub(crate) fn update<T: Real>(lanes: AdamWLanes<'_, T>, s: &AdamWScalars<T>) {
    let elements = lanes
        .params
        .iter_mut()
        .zip(lanes.grads)
        .zip(lanes.exp_avg.iter_mut().zip(lanes.exp_avg_sq));
    match lanes.max_exp_avg_sq {
        None => {
            for ((param, &grad), (exp_avg, exp_avg_sq)) in elements {
                update_moments(param, grad, exp_avg, exp_avg_sq, s);
                apply_update(param, *exp_avg, *exp_avg_sq, s);
            }
        }
        Some(max_exp_avg_sq) => {
            for (((param, &grad), (exp_avg, exp_avg_sq)), max) in elements.zip(max_exp_avg_sq) {
                update_moments(param, grad, exp_avg, exp_avg_sq, s);
                *max = max.maximum(*exp_avg_sq);
                apply_update(param, *exp_avg, *max, s);
            }
        }
    }
}

/// Decoupled weight decay and the moment updates (`exp_avg.lerp_`, `exp_avg_sq.mul_.addcmul_`).
#[inline(always)]
fn update_moments<T: Real>(
    param: &mut T,
    grad: T,
    exp_avg: &mut T,
    exp_avg_sq: &mut T,
    s: &AdamWScalars<T>,
) {
    *param = *param * s.decay;
    *exp_avg = lerp(*exp_avg, grad, s.one_minus_beta1);
    *exp_avg_sq = *exp_avg_sq * s.beta2 + s.one_minus_beta2 * grad * grad;
}

/// `param.addcdiv_(exp_avg, sqrt(second_moment) / sqrt(bc2) + eps, value=-step_size)`.
#[inline(always)]
fn apply_update<T: Real>(param: &mut T, exp_avg: T, second_moment: T, s: &AdamWScalars<T>) {
    let denom = second_moment.sqrt() / s.bias_correction2_sqrt + s.eps;
    *param = *param + s.neg_step_size * exp_avg / denom;
}

#[cfg(test)]
mod tests {
    use super::lerp;

    #[test]
    fn lerp_takes_either_branch_of_torch_kernel() {
        // small weight: 1 + 0.25 * (3 - 1); large weight: 3 - (3 - 1) * (1 - 0.75)
        assert_eq!(lerp(1.0_f64, 3.0, 0.25), 1.5);
        assert_eq!(lerp(1.0_f64, 3.0, 0.75), 2.5);
        // the large-weight branch lands exactly on `end` at weight 1
        assert_eq!(lerp(0.1_f32, 0.7, 1.0), 0.7);
    }
}
