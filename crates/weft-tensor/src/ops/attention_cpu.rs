//! CPU kernels of the fused causal attention (see `attention.rs`): the same three passes as
//! `kernels/attention.cu`, computed in f64, one (batch, head) plane per rayon task. Row `i`
//! attends to keys `0..=i`; `L_i` is the log-sum-exp of its scaled scores, `delta_i` the sum of
//! `dO_i ∘ O_i`.

use candle_core::Result;
use rayon::prelude::*;

use super::storage::{CpuKernel, Float};

/// The shape of one attention call: planes (batch × heads), sequence length, head width.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AttentionShape {
    pub planes: usize,
    pub seq: usize,
    pub width: usize,
    pub scale: f64,
}

/// Which pass a kernel computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttentionPass {
    /// `(q, k, v)` → `[O | L]` per row (`width + 1` values).
    Forward,
    /// `([q | dO], [k | v], [L | delta])` → `[dK | dV]` per key row.
    KeyValueGrads,
    /// `([q | dO], [k | v], [L | delta])` → `dQ` per query row.
    QueryGrads,
}

pub(crate) struct AttentionKernel {
    pub pass: AttentionPass,
    pub shape: AttentionShape,
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn wide<T: Float>(s: &[T]) -> Vec<f64> {
    s.iter().map(|v| v.to_f64()).collect()
}

impl AttentionKernel {
    /// One plane's forward: `[O | L]` rows.
    fn forward_plane(&self, q: &[f64], k: &[f64], v: &[f64], out: &mut [f64]) {
        let AttentionShape {
            seq,
            width: d,
            scale,
            ..
        } = self.shape;
        for i in 0..seq {
            let qi = &q[i * d..(i + 1) * d];
            let scores: Vec<f64> = (0..=i)
                .map(|j| dot(qi, &k[j * d..(j + 1) * d]) * scale)
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = weights.iter().sum();
            let row = &mut out[i * (d + 1)..(i + 1) * (d + 1)];
            row.fill(0.0);
            for (j, w) in weights.iter().enumerate() {
                for (o, x) in row[..d].iter_mut().zip(&v[j * d..(j + 1) * d]) {
                    *o += w / sum * x;
                }
            }
            row[d] = max + sum.ln();
        }
    }

    /// `ds_ij`, the gradient of row i's score for key j, and `p_ij`.
    fn score_grad(&self, qdo: &[f64], kv: &[f64], stats: &[f64], i: usize, j: usize) -> (f64, f64) {
        let AttentionShape {
            width: d, scale, ..
        } = self.shape;
        let (qi, doi) = (
            &qdo[i * 2 * d..i * 2 * d + d],
            &qdo[i * 2 * d + d..(i + 1) * 2 * d],
        );
        let (kj, vj) = (
            &kv[j * 2 * d..j * 2 * d + d],
            &kv[j * 2 * d + d..(j + 1) * 2 * d],
        );
        let p = (dot(qi, kj) * scale - stats[2 * i]).exp();
        (p * (dot(doi, vj) - stats[2 * i + 1]), p)
    }

    fn key_value_plane(&self, qdo: &[f64], kv: &[f64], stats: &[f64], out: &mut [f64]) {
        let AttentionShape {
            seq,
            width: d,
            scale,
            ..
        } = self.shape;
        out.fill(0.0);
        for j in 0..seq {
            for i in j..seq {
                let (ds, p) = self.score_grad(qdo, kv, stats, i, j);
                let (qi, doi) = (
                    &qdo[i * 2 * d..i * 2 * d + d],
                    &qdo[i * 2 * d + d..(i + 1) * 2 * d],
                );
                let row = &mut out[j * 2 * d..(j + 1) * 2 * d];
                for c in 0..d {
                    row[c] += ds * scale * qi[c];
                    row[d + c] += p * doi[c];
                }
            }
        }
    }

    fn query_plane(&self, qdo: &[f64], kv: &[f64], stats: &[f64], out: &mut [f64]) {
        let AttentionShape {
            seq,
            width: d,
            scale,
            ..
        } = self.shape;
        out.fill(0.0);
        for i in 0..seq {
            for j in 0..=i {
                let (ds, _) = self.score_grad(qdo, kv, stats, i, j);
                let kj = &kv[j * 2 * d..j * 2 * d + d];
                for (o, x) in out[i * d..(i + 1) * d].iter_mut().zip(kj) {
                    *o += ds * scale * x;
                }
            }
        }
    }

    /// Values per row of the pass's inputs and output.
    fn row_widths(&self) -> ([usize; 3], usize) {
        let d = self.shape.width;
        match self.pass {
            AttentionPass::Forward => ([d, d, d], d + 1),
            AttentionPass::KeyValueGrads => ([2 * d, 2 * d, 2], 2 * d),
            AttentionPass::QueryGrads => ([2 * d, 2 * d, 2], d),
        }
    }
}

impl CpuKernel for AttentionKernel {
    fn run<T: Float>(&self, args: &[&[T]]) -> Result<Vec<T>> {
        let (inputs, out_width) = self.row_widths();
        let seq = self.shape.seq;
        let mut out = vec![0f64; self.shape.planes * seq * out_width];
        out.par_chunks_mut(seq * out_width)
            .enumerate()
            .for_each(|(plane, out)| {
                let part = |a: usize| {
                    wide(&args[a][plane * seq * inputs[a]..(plane + 1) * seq * inputs[a]])
                };
                let (a, b, c) = (part(0), part(1), part(2));
                match self.pass {
                    AttentionPass::Forward => self.forward_plane(&a, &b, &c, out),
                    AttentionPass::KeyValueGrads => self.key_value_plane(&a, &b, &c, out),
                    AttentionPass::QueryGrads => self.query_plane(&a, &b, &c, out),
                }
            });
        Ok(out.into_iter().map(T::from_f64).collect())
    }
}
