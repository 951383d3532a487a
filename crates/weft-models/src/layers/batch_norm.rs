//! `BatchNorm2d` with PyTorch semantics: batch statistics in training mode, running statistics
//! in evaluation mode; running mean/var updated with momentum 0.1 from the *unbiased* batch
//! variance; `num_batches_tracked` counted. Weight 1, bias 0 at initialisation. When its
//! [`CrossRankSlot`] holds a cross-rank sum, training mode normalises with the statistics of the
//! global batch over all ranks (SyncBatchNorm), forward and backward.

use candle_core::{DType, Tensor, Var};
use weft_tensor::ops::BatchNormOutput;
use weft_tensor::{ops, CrossRankSlot, CrossRankSum, Mode, ParamGrad, Scope};

use weft_tensor::Result;

/// Batch normalisation over the N, H, W axes of an NCHW tensor.
pub struct BatchNorm2d {
    weight: Var,
    bias: Var,
    running_mean: Var,
    running_var: Var,
    num_batches_tracked: Var,
    eps: f64,
    momentum: f64,
    sync: CrossRankSlot,
}

impl BatchNorm2d {
    /// Registers `weight`, `bias`, `running_mean`, `running_var`, `num_batches_tracked` in `scope`.
    /// `zero_weight` starts the scale at zero (torchvision's `zero_init_residual`).
    /// `sync` is the model's slot for SyncBatchNorm (empty: local batch statistics).
    pub fn new(
        scope: &mut Scope,
        channels: usize,
        zero_weight: bool,
        sync: &CrossRankSlot,
    ) -> Result<Self> {
        let (dtype, device) = (scope.dtype(), scope.device());
        let ones = Tensor::ones(channels, dtype, &device)?;
        let zeros = Tensor::zeros(channels, dtype, &device)?;
        let weight = if zero_weight {
            zeros.clone()
        } else {
            ones.clone()
        };
        Ok(Self {
            weight: scope.parameter("weight", weight)?,
            bias: scope.parameter("bias", zeros.clone())?,
            running_mean: scope.buffer("running_mean", zeros)?,
            running_var: scope.buffer("running_var", ones)?,
            num_batches_tracked: scope
                .buffer("num_batches_tracked", Tensor::new(0i64, &device)?)?,
            eps: 1e-5,
            momentum: 0.1,
            sync: sync.clone(),
        })
    }

    pub fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        if let Some(y) = self.infer(x, mode, false)? {
            return Ok(y);
        }
        if !mode.train {
            return self.normalize_with(
                x,
                self.running_mean.as_tensor(),
                self.running_var.as_tensor(),
            );
        }
        if let Some(sum) = self.sync.get() {
            return self.forward_synced(x, mode, sum.as_ref());
        }
        let (y, mean, var) = ops::batch_norm_train(x, &self.weight, &self.bias, self.eps)?;
        if mode.update_running_stats {
            let (n, _, h, w) = x.dims4()?;
            self.update_running_stats((n * h * w) as f64, &mean, &var)?;
        }
        Ok(y)
    }

    /// `relu(forward(x))`, fused into one pass in local training mode.
    pub fn forward_relu(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        if let Some(y) = self.infer(x, mode, true)? {
            return Ok(y);
        }
        if !mode.train || self.sync.get().is_some() {
            return Ok(ops::relu(&self.forward(x, mode)?)?);
        }
        let (y, mean, var) = ops::batch_norm_relu_train(x, &self.weight, &self.bias, self.eps)?;
        if mode.update_running_stats {
            let (n, _, h, w) = x.dims4()?;
            self.update_running_stats((n * h * w) as f64, &mean, &var)?;
        }
        Ok(y)
    }

    /// Whether [`BatchNorm2d::forward_graph_free`] applies: training mode (with this rank's
    /// batch statistics, or the global batch's under SyncBatchNorm) on tensors weft's kernels
    /// take.
    pub fn differentiates_itself(&self, x: &Tensor, mode: Mode) -> bool {
        mode.train && ops::has_kernels(x)
    }

    /// Training mode without an autograd graph (then a ReLU when `relu`), updating the running
    /// statistics as [`BatchNorm2d::forward`] does; for blocks with their own backward. Under
    /// SyncBatchNorm the statistics are the global batch's, on weft's kernels.
    /// With `sums`, `x`'s per-channel `[sum; sum of squares]` from the convolution that wrote
    /// it ([`crate::layers::Conv2d::forward_graph_free`]), this rank's statistics come from
    /// them instead of from a pass over `x`.
    pub fn forward_graph_free(
        &self,
        x: &Tensor,
        sums: Option<&Tensor>,
        mode: Mode,
        relu: bool,
    ) -> Result<BatchNormOutput> {
        let sync = self.sync.get();
        let stats = self.training_stats(sync.as_deref(), mode);
        let affine = (self.weight.as_tensor(), self.bias.as_tensor());
        let out = match sums {
            Some(sums) => {
                ops::batch_norm_train_forward_from_sums(x, sums, affine, self.eps, relu, stats)?
            }
            None => ops::batch_norm_train_forward(x, affine.0, affine.1, self.eps, relu, stats)?,
        };
        self.track_graph_free(mode, &out)?;
        Ok(out)
    }

    /// [`BatchNorm2d::forward_graph_free`] without ReLU, then `max(y + residual, 0)` (the end
    /// of a residual block, one pass on channels-last GPU data); the output is that sum's.
    pub fn forward_graph_free_add_relu(
        &self,
        x: &Tensor,
        sums: Option<&Tensor>,
        mode: Mode,
        residual: &Tensor,
    ) -> Result<BatchNormOutput> {
        let sync = self.sync.get();
        let stats = self.training_stats(sync.as_deref(), mode);
        let (weight, bias) = (self.weight.as_tensor(), self.bias.as_tensor());
        let out = match sums {
            Some(sums) => ops::batch_norm_train_forward_add_relu_from_sums(
                x,
                sums,
                (weight, bias),
                self.eps,
                residual,
                stats,
            )?,
            None => {
                ops::batch_norm_train_forward_add_relu(x, weight, bias, self.eps, residual, stats)?
            }
        };
        self.track_graph_free(mode, &out)?;
        Ok(out)
    }

    /// The statistics a graph-free training forward normalises with: the global batch's
    /// through `sync`, else this rank's, blended into the running statistics by the pass that
    /// computes them when `mode` asks.
    fn training_stats<'a>(
        &'a self,
        sync: Option<&'a dyn CrossRankSum>,
        mode: Mode,
    ) -> ops::BatchStats<'a> {
        match (sync, mode.update_running_stats) {
            (Some(_), _) | (None, false) => batch_stats(sync),
            (None, true) => ops::BatchStats::LocalUpdating(ops::RunningUpdate {
                stats: self.running_stats(),
                momentum: self.momentum,
            }),
        }
    }

    /// The running statistics' update of a graph-free forward under SyncBatchNorm, when `mode`
    /// asks, unbiased by the global count on the device (with local statistics the forward
    /// itself updates them, [`ops::BatchStats::LocalUpdating`]).
    fn track_graph_free(&self, mode: Mode, out: &BatchNormOutput) -> Result<()> {
        match (&out.unbiasing, mode.update_running_stats) {
            (Some(factor), true) => {
                let unbiased = out.var()?.broadcast_mul(factor)?;
                self.blend_running_stats(&out.mean()?, &unbiased, 1.0)
            }
            _ => Ok(()),
        }
    }

    /// The input gradient (if `input_grad`) and the weight and bias gradients, keyed by their
    /// ids, of a [`BatchNorm2d::forward_graph_free`] of `x` with statistics `table`;
    /// `relu_output` is its output when it applied the ReLU.
    pub fn backward(
        &self,
        x: &Tensor,
        table: &Tensor,
        relu_output: Option<&Tensor>,
        dy: &Tensor,
        input_grad: bool,
    ) -> Result<(Option<Tensor>, [ParamGrad; 2])> {
        let sync = self.sync.get();
        let stats = batch_stats(sync.as_deref());
        let g =
            ops::batch_norm_train_backward(x, table, relu_output, dy, self.eps, input_grad, stats)?;
        Ok((
            g.x,
            [
                (self.weight.as_tensor().id(), g.weight),
                (self.bias.as_tensor().id(), g.bias),
            ],
        ))
    }

    /// Training mode with the statistics of the global batch, as one process computes them on
    /// the concatenated batch. Each rank computes its per-channel mean and sum of squared
    /// deviations (M2) around it, in f32 (f64 for f64 inputs); the ranks' statistics are combined
    /// as Chan et al. combine partial moments (PyTorch's `batch_norm_gather_stats_with_counts`):
    /// a first differentiable sum over ranks gives the count and the global mean, a second the
    /// global M2 = Σ M2_r + n_r (mean_r − mean)². No sum of squares is ever subtracted from
    /// another, so data whose mean is large against its spread keeps its variance (the
    /// E[x²] − E[x]² formula cancels catastrophically there). The count stays on the device.
    fn forward_synced(&self, x: &Tensor, mode: Mode, sum: &dyn CrossRankSum) -> Result<Tensor> {
        let (n, c, h, w) = x.dims4()?;
        let count = (n * h * w) as f64;
        let stats = if x.dtype() == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let per_channel = |t: &Tensor| -> candle_core::Result<Tensor> {
            t.sum_keepdim(0)?
                .sum_keepdim(2)?
                .sum_keepdim(3)?
                .flatten_all()
        };
        let xs = x.to_dtype(stats)?;
        let local_mean = (per_channel(&xs)? / count)?;
        let centered = xs.broadcast_sub(&local_mean.reshape((1, c, 1, 1))?)?;
        let local_m2 = per_channel(&centered.sqr()?)?;
        let local_count = Tensor::full(count, 1, x.device())?.to_dtype(stats)?;
        let first = sum.sum(&Tensor::cat(&[(&local_mean * count)?, local_count], 0)?)?;
        let total = first.narrow(0, c, 1)?;
        let mean = first.narrow(0, 0, c)?.broadcast_div(&total)?;
        let spread = ((&local_mean - &mean)?.sqr()? * count)?;
        let m2 = sum.sum(&(local_m2 + spread)?)?;
        let var = m2.broadcast_div(&total)?;
        let (mean, var) = (mean.to_dtype(x.dtype())?, var.to_dtype(x.dtype())?);
        let y = self.normalize_with(x, &mean, &var)?;
        if mode.update_running_stats {
            let correction = unbiasing(&total.detach())?;
            let unbiased = var
                .detach()
                .broadcast_mul(&correction.to_dtype(x.dtype())?)?;
            self.blend_running_stats(&mean.detach(), &unbiased, 1.0)?;
        }
        Ok(y)
    }

    /// Inference (evaluation mode, nothing to differentiate) on tensors weft's kernels take:
    /// one graph-free pass with the running statistics (then a ReLU when `relu`), in `x`'s
    /// layout; `None` elsewhere.
    fn infer(&self, x: &Tensor, mode: Mode, relu: bool) -> Result<Option<Tensor>> {
        if mode.train || mode.differentiable || !ops::has_kernels(x) {
            return Ok(None);
        }
        let stats = ops::EvalStats {
            running_mean: self.running_mean.as_tensor(),
            running_var: self.running_var.as_tensor(),
            weight: self.weight.as_tensor(),
            bias: self.bias.as_tensor(),
        };
        Ok(Some(ops::batch_norm_eval(x, stats, self.eps, relu)?))
    }

    /// `(x - mean) / sqrt(var + eps) * weight + bias` with per-channel `mean` and `var`,
    /// centred first: its backward then sums `dy · (x − mean)`, not `dy · x` less `mean · Σ dy`,
    /// which cancels catastrophically in f32 where the mean is large against the spread.
    fn normalize_with(&self, x: &Tensor, mean: &Tensor, var: &Tensor) -> Result<Tensor> {
        let per_channel = |t: &Tensor| t.reshape((1, t.elem_count(), 1, 1));
        let scale = self.weight.as_tensor().div(&(var + self.eps)?.sqrt()?)?;
        Ok(x.broadcast_sub(&per_channel(mean)?)?
            .broadcast_mul(&per_channel(&scale)?)?
            .broadcast_add(&per_channel(self.bias.as_tensor())?)?)
    }

    /// Blends the batch statistics (over `count` elements per channel) into the running ones.
    fn update_running_stats(&self, count: f64, mean: &Tensor, biased_var: &Tensor) -> Result<()> {
        self.blend_running_stats(mean, biased_var, count / (count - 1.0).max(1.0))
    }

    /// The running statistics and the count of batches blended into them.
    fn running_stats(&self) -> ops::RunningStats<'_> {
        ops::RunningStats {
            mean: self.running_mean.as_tensor(),
            var: self.running_var.as_tensor(),
            count: self.num_batches_tracked.as_tensor(),
        }
    }

    /// Blends a batch's mean and its variance times `var_scale` (the unbiasing factor) into the
    /// running statistics (momentum) and counts the batch.
    fn blend_running_stats(&self, mean: &Tensor, var: &Tensor, var_scale: f64) -> Result<()> {
        Ok(ops::update_running_stats(
            self.running_stats(),
            mean,
            var,
            self.momentum,
            var_scale,
        )?)
    }
}

/// The statistics a graph-free pass takes: the global batch's through `sync`, if installed.
fn batch_stats(sync: Option<&dyn CrossRankSum>) -> ops::BatchStats<'_> {
    match sync {
        Some(sum) => ops::BatchStats::Global(sum),
        None => ops::BatchStats::Local,
    }
}

/// The factor `N / (N − 1)` that unbiases a variance over `total` = N elements (shape `1`, on
/// the device).
fn unbiasing(total: &Tensor) -> Result<Tensor> {
    Ok(total.broadcast_div(&(total - 1.0)?.maximum(1.0)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use weft_tensor::ParamStore;

    fn bn() -> (ParamStore, BatchNorm2d) {
        let mut store = ParamStore::new(&Device::Cpu, DType::F64);
        let bn =
            BatchNorm2d::new(&mut store.scope("bn"), 2, false, &CrossRankSlot::default()).unwrap();
        (store, bn)
    }

    /// x: N=2, C=2, H=1, W=2. Channel 0 holds 1, 2, 3, 4; channel 1 holds 10, 10, 10, 14.
    fn input() -> Tensor {
        Tensor::new(
            &[[[[1f64, 2.]], [[10., 10.]]], [[[3., 4.]], [[10., 14.]]]],
            &Device::Cpu,
        )
        .unwrap()
    }

    #[test]
    fn training_mode_uses_batch_statistics_and_updates_running_ones() {
        let (store, bn) = bn();
        let y = bn.forward(&input(), Mode::TRAIN).unwrap();
        // Channel 0: mean 2.5, biased var 1.25 -> (1 - 2.5)/sqrt(1.25 + 1e-5) = -1.3416354...
        let y0: Vec<f64> = y.flatten_all().unwrap().to_vec1().unwrap();
        let inv = 1.0 / (1.25f64 + 1e-5).sqrt();
        assert!((y0[0] - (-1.5 * inv)).abs() < 1e-12);
        assert!((y0[4] - (0.5 * inv)).abs() < 1e-12);
        // Running mean: 0.9 * 0 + 0.1 * 2.5 = 0.25 (channel 0), 0.1 * 11 = 1.1 (channel 1).
        let rm: Vec<f64> = store
            .get("bn.running_mean")
            .unwrap()
            .tensor()
            .to_vec1()
            .unwrap();
        assert!((rm[0] - 0.25).abs() < 1e-12 && (rm[1] - 1.1).abs() < 1e-12);
        // Running var from the unbiased variance: channel 0: 5/3; 0.9 * 1 + 0.1 * 5/3.
        // Channel 1: values 10,10,10,14, mean 11, unbiased var (1+1+1+9)/3 = 4 -> 0.9 + 0.4.
        let rv: Vec<f64> = store
            .get("bn.running_var")
            .unwrap()
            .tensor()
            .to_vec1()
            .unwrap();
        assert!((rv[0] - (0.9 + 0.1 * 5.0 / 3.0)).abs() < 1e-12, "{rv:?}");
        assert!((rv[1] - 1.3).abs() < 1e-12, "{rv:?}");
        let tracked = store
            .get("bn.num_batches_tracked")
            .unwrap()
            .tensor()
            .to_scalar::<i64>()
            .unwrap();
        assert_eq!(tracked, 1);
    }

    #[test]
    fn recompute_mode_does_not_touch_running_statistics() {
        let (store, bn) = bn();
        bn.forward(&input(), Mode::TRAIN.recompute()).unwrap();
        let rm: Vec<f64> = store
            .get("bn.running_mean")
            .unwrap()
            .tensor()
            .to_vec1()
            .unwrap();
        assert_eq!(rm, [0.0, 0.0]);
    }

    fn set(store: &ParamStore, name: &str, values: &[f64]) {
        let value = Tensor::new(values, &Device::Cpu).unwrap();
        store.get(name).unwrap().var.set(&value).unwrap();
    }

    #[test]
    fn eval_mode_uses_running_statistics() {
        let (store, bn) = bn();
        set(&store, "bn.running_mean", &[1f64, 2.]);
        set(&store, "bn.running_var", &[4f64, 9.]);
        set(&store, "bn.weight", &[2f64, 1.]);
        set(&store, "bn.bias", &[0.5f64, -1.]);
        let y: Vec<f64> = bn
            .forward(&input(), Mode::EVAL)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        // Channel 0, x=1: (1-1)/sqrt(4+1e-5)*2+0.5 = 0.5; channel 1, x=14: (14-2)/sqrt(9+1e-5) - 1.
        assert!((y[0] - 0.5).abs() < 1e-12);
        assert!((y[7] - (12.0 / (9.0f64 + 1e-5).sqrt() - 1.0)).abs() < 1e-12);
    }
}
