//! CPU kernels of training-mode batch normalisation on contiguous NCHW slices: channel
//! statistics, the normalising forward, and the two backward passes. Reductions run in
//! parallel over channels and accumulate in f64; elementwise passes run over planes.

use super::storage::Float;
use rayon::prelude::*;

/// Shape of the data: `channels` channels of `plane`-element (H * W) planes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChannelLayout {
    pub channels: usize,
    pub plane: usize,
}

impl ChannelLayout {
    /// Per-channel f64 sums of the `N` values `f(channel, a, b)` over all planes of each
    /// channel of `a` and `b`, in one pass.
    fn channel_sums<T: Float, const N: usize>(
        &self,
        a: &[T],
        b: &[T],
        f: impl Fn(usize, f64, f64) -> [f64; N] + Sync,
    ) -> Vec<[f64; N]> {
        let (channels, plane) = (self.channels, self.plane);
        (0..channels)
            .into_par_iter()
            .map(|c| {
                // Eight independent accumulators per sum let the additions vectorise.
                let mut lanes = [[0f64; 8]; N];
                let mut tail = [0f64; N];
                for start in (c * plane..a.len()).step_by(channels * plane) {
                    let (pa, pb) = (&a[start..start + plane], &b[start..start + plane]);
                    let (pa8, pb8) = (pa.chunks_exact(8), pb.chunks_exact(8));
                    for (x, y) in pa8.remainder().iter().zip(pb8.remainder()) {
                        let terms = f(c, x.to_f64(), y.to_f64());
                        (0..N).for_each(|s| tail[s] += terms[s]);
                    }
                    for (x, y) in pa8.zip(pb8) {
                        for k in 0..8 {
                            let terms = f(c, x[k].to_f64(), y[k].to_f64());
                            (0..N).for_each(|s| lanes[s][k] += terms[s]);
                        }
                    }
                }
                std::array::from_fn(|s| lanes[s].iter().sum::<f64>() + tail[s])
            })
            .collect()
    }

    /// `out = scale[c] * a + shift[c] (+ b_scale[c] * b)` elementwise, channel by plane.
    fn combine<T: Float>(
        &self,
        a: &[T],
        b: Option<(&[T], &[T])>,
        scale: &[T],
        shift: &[T],
    ) -> Vec<T> {
        let mut out = vec![T::ZERO; a.len()];
        out.par_chunks_mut(self.plane)
            .enumerate()
            .for_each(|(i, dst)| {
                let c = i % self.channels;
                let src = &a[i * self.plane..][..self.plane];
                let (s, t) = (scale[c], shift[c]);
                match b {
                    None => dst.iter_mut().zip(src).for_each(|(d, x)| *d = s * *x + t),
                    Some((b, b_scale)) => {
                        let (src_b, u) = (&b[i * self.plane..][..self.plane], b_scale[c]);
                        for ((d, x), y) in dst.iter_mut().zip(src).zip(src_b) {
                            *d = s * *x + u * *y + t;
                        }
                    }
                }
            });
        out
    }

    /// Elements per channel (`N * H * W`).
    fn per_channel(&self, total: usize) -> f64 {
        (total / self.channels) as f64
    }
}

/// Casts f64 values to `T`.
fn cast<T: Float>(values: impl Iterator<Item = f64>) -> Vec<T> {
    values.map(T::from_f64).collect()
}

/// Per-channel `[mean..., biased variance...]` (length `2 * channels`), two-pass.
pub(crate) fn moments<T: Float>(x: &[T], l: &ChannelLayout) -> Vec<T> {
    let m = l.per_channel(x.len());
    let sums = l.channel_sums(x, x, |_, v, _| [v]);
    let means: Vec<f64> = sums.iter().map(|[s]| s / m).collect();
    let vars = l.channel_sums(x, x, |c, v, _| [(v - means[c]) * (v - means[c])]);
    cast(means.iter().copied().chain(vars.iter().map(|[s]| s / m)))
}

/// Per-channel inverse standard deviations from the variance row of `moments`.
fn inv_stds<T: Float>(moments: &[T], channels: usize, eps: f64) -> Vec<f64> {
    moments[channels..2 * channels]
        .iter()
        .map(|v| 1.0 / (v.to_f64() + eps).sqrt())
        .collect()
}

/// `y = (x - mean) / sqrt(var + eps) * weight + bias`, with `affine = [weight..., bias...]`.
pub(crate) fn forward<T: Float>(
    x: &[T],
    affine: &[T],
    moments: &[T],
    l: &ChannelLayout,
    eps: f64,
) -> Vec<T> {
    let c = l.channels;
    let inv_std = inv_stds(moments, c, eps);
    let scale: Vec<f64> = (0..c).map(|i| affine[i].to_f64() * inv_std[i]).collect();
    let shift = (0..c).map(|i| affine[c + i].to_f64() - moments[i].to_f64() * scale[i]);
    l.combine(x, None, &cast(scale.iter().copied()), &cast(shift))
}

/// Per-channel `[sum(dy * xhat)..., sum(dy)...]`: the weight and bias gradients.
pub(crate) fn grad_sums<T: Float>(
    x: &[T],
    dy: &[T],
    moments: &[T],
    l: &ChannelLayout,
    eps: f64,
) -> Vec<T> {
    let c = l.channels;
    let inv_std = inv_stds(moments, c, eps);
    let mean: Vec<f64> = moments[..c].iter().map(|v| v.to_f64()).collect();
    let sums = l.channel_sums(x, dy, |ch, v, g| [(v - mean[ch]) * g, g]);
    let dot = sums
        .iter()
        .zip(&inv_std)
        .map(|([dot, _], inv_std)| dot * inv_std);
    cast(dot.chain(sums.iter().map(|[_, sum_dy]| *sum_dy)))
}

/// Input gradient `dx = inv_std * w / M * (M * dy - sum(dy) - xhat * sum(dy * xhat))` from
/// `table = [mean, var, weight, bias, sum(dy * xhat), sum(dy)]` (rows of `channels`).
pub(crate) fn grad_input<T: Float>(
    x: &[T],
    dy: &[T],
    table: &[T],
    l: &ChannelLayout,
    eps: f64,
) -> Vec<T> {
    let c = l.channels;
    let m = l.per_channel(x.len());
    let row = |r: usize, i: usize| table[r * c + i].to_f64();
    let inv_std = inv_stds(table, c, eps);
    let (mut dy_scale, mut x_scale, mut shift) = (Vec::new(), Vec::new(), Vec::new());
    for (i, &inv_std) in inv_std.iter().enumerate() {
        let k = inv_std * row(2, i);
        let (mean_dy, mean_dy_xhat) = (row(5, i) / m, row(4, i) / m);
        dy_scale.push(T::from_f64(k));
        x_scale.push(T::from_f64(-k * inv_std * mean_dy_xhat));
        shift.push(T::from_f64(
            k * (row(0, i) * inv_std * mean_dy_xhat - mean_dy),
        ));
    }
    l.combine(dy, Some((x, &x_scale)), &dy_scale, &shift)
}
