//! cuDNN's fused causal attention (its flash-attention engines) described as the graphs
//! cudnn-frontend's composite `sdpa` and `sdpa_backward` nodes build for cuDNN 9: scores
//! `Q Kᵀ · scale` with the causal mask (row index ≥ column index, −∞ elsewhere), the softmax
//! with its per-row statistics `max + ln Σ exp` kept for the backward, the output `P V`; and the
//! backward (`sdpa_graph_backward`) recomputing the weights from those statistics, `Σ dO·O` per
//! row, and `dV = Pᵀ dO`, `dK = dSᵀ Q`, `dQ = dS K` with `dS = P (dP − Σ dO·O) · scale`.
//! cuDNN recognises the pattern only when every node has the frontend's types and shapes:
//! intermediates in f32, the weights in the data's type before the second product, index
//! tensors i32 and the mask boolean. Grouped-query attention reads each key/value head for its
//! group of query heads (the products broadcast over the head dimension) and sums the groups'
//! `dK`, `dV`.
//!
//! With dropout of the attention weights the graphs add cudnn-frontend's dropout pattern: a
//! Bernoulli mask from cuDNN's Philox generator (keep probability `1 − p`, keyed by a seed and
//! an offset read from device memory, so a graph replay reads new ones) multiplied into the
//! weights with the scale `1 / (1 − p)` before `P V`; the backward (`sdpa_graph_backward`)
//! draws the same mask again from the same seed and offset.

use cudarc::cudnn::result::CudnnResult;
use cudarc::cudnn::sys;

use sys::cudnnDataType_t::{
    CUDNN_DATA_BOOLEAN as BOOLEAN, CUDNN_DATA_FLOAT as FLOAT, CUDNN_DATA_INT32 as INT32,
    CUDNN_DATA_INT64 as INT64,
};
use sys::cudnnPointwiseMode_t as Mode;
use sys::cudnnReduceTensorOp_t::{CUDNN_REDUCE_TENSOR_ADD as SUM, CUDNN_REDUCE_TENSOR_MAX as MAX};

use super::cudnn_backend::{first_plan, Descriptor};
use super::cudnn_graph::{packed, GraphBuilder, Node};

/// The unique ids of the graphs' tensors in memory and scalars.
pub(crate) mod uid {
    pub const Q: i64 = 1;
    pub const K: i64 = 2;
    pub const V: i64 = 3;
    pub const O: i64 = 4;
    pub const STATS: i64 = 5;
    pub const D_O: i64 = 6;
    pub const D_Q: i64 = 7;
    pub const D_K: i64 = 8;
    pub const D_V: i64 = 9;
    pub const SCALE: i64 = 10;
    pub const NEG_INF: i64 = 11;
    pub const ONE: i64 = 12;
    /// The backward's per-row `Σ dO·O` (f32, in the caller's scratch memory).
    pub const ROW_DOT: i64 = 13;
    /// The backward's f32 accumulator of `dQ` (non-deterministic variant only).
    pub const DQ_ACCUM: i64 = 14;
    /// Dropout's Philox seed and offset (INT64 `[1, 1, 1, 1]`, in device memory).
    pub const SEED: i64 = 15;
    pub const OFFSET: i64 = 16;
    /// Dropout's scale `1 / (1 − p)` and its inverse `1 − p` (f32, by value).
    pub const DROPOUT_SCALE: i64 = 17;
    pub const DROPOUT_SCALE_INV: i64 = 18;
}

/// The shape of one attention call and where its tensors lie: `[batch, heads, seq, head_dim]`
/// tensors (`kv_heads` heads for keys and values) with the strides of each in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SdpaGeometry {
    pub batch: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub seq: i64,
    pub head_dim: i64,
    /// Strides of q, k and v (their gradients are written with the same ones).
    pub qkv_strides: [[i64; 4]; 3],
    /// Strides of the output (and of its gradient).
    pub out_strides: [i64; 4],
}

impl SdpaGeometry {
    pub(crate) fn q_dims(&self) -> [i64; 4] {
        [self.batch, self.heads, self.seq, self.head_dim]
    }

    pub(crate) fn kv_dims(&self) -> [i64; 4] {
        [self.batch, self.kv_heads, self.seq, self.head_dim]
    }

    /// `[batch, heads, seq, seq]`: the scores.
    pub(crate) fn score_dims(&self) -> [i64; 4] {
        [self.batch, self.heads, self.seq, self.seq]
    }

    /// `[batch, heads, seq, 1]`: one value per query row.
    pub fn row_dims(&self) -> [i64; 4] {
        [self.batch, self.heads, self.seq, 1]
    }
}

/// A `[.., rows, cols]` tensor's transpose as the same memory (`Kᵀ` from `K`).
pub(crate) fn swapped(dims: [i64; 4], strides: [i64; 4]) -> ([i64; 4], [i64; 4]) {
    (
        [dims[0], dims[1], dims[3], dims[2]],
        [strides[0], strides[1], strides[3], strides[2]],
    )
}

/// The causal mask over `scores`: kept where the row index is at least the column index,
/// `neg_inf` elsewhere (the frontend's top-left diagonal band with right bound 0).
pub(crate) fn causal_mask(
    g: &mut GraphBuilder,
    scores: &Node,
    neg_inf: &Node,
) -> CudnnResult<Node> {
    let row = g.virt_like(scores, INT32)?;
    g.pointwise(
        Mode::CUDNN_POINTWISE_GEN_INDEX,
        &[scores],
        &row,
        FLOAT,
        Some(2),
    )?;
    let col = g.virt_like(scores, INT32)?;
    g.pointwise(
        Mode::CUDNN_POINTWISE_GEN_INDEX,
        &[scores],
        &col,
        FLOAT,
        Some(3),
    )?;
    let keep = g.virt_like(scores, BOOLEAN)?;
    g.pointwise(
        Mode::CUDNN_POINTWISE_CMP_GE,
        &[&row, &col],
        &keep,
        BOOLEAN,
        None,
    )?;
    let masked = g.virt_like(scores, FLOAT)?;
    let select = Mode::CUDNN_POINTWISE_BINARY_SELECT;
    g.pointwise(select, &[scores, neg_inf, &keep], &masked, FLOAT, None)?;
    Ok(masked)
}

/// `out = mode(inputs)` into a new f32 virtual tensor shaped as `like`.
pub(crate) fn elementwise(
    g: &mut GraphBuilder,
    mode: Mode,
    inputs: &[&Node],
    like: &Node,
) -> CudnnResult<Node> {
    let out = g.virt_like(like, FLOAT)?;
    g.pointwise(mode, inputs, &out, FLOAT, None)?;
    Ok(out)
}

/// `Q Kᵀ · scale` (`[batch, heads, seq, seq]`, f32) from the graph's q and k: the inputs both
/// passes start from, with the scale and −∞ scalars. Returns (q, kᵀ, scores, scale, −∞).
pub(crate) fn scaled_scores(
    g: &mut GraphBuilder,
    s: &SdpaGeometry,
    io: sys::cudnnDataType_t,
) -> CudnnResult<[Node; 5]> {
    let q = g.memory(uid::Q, io, s.q_dims(), s.qkv_strides[0])?;
    let (kt_dims, kt_strides) = swapped(s.kv_dims(), s.qkv_strides[1]);
    let kt = g.memory(uid::K, io, kt_dims, kt_strides)?;
    let scale = g.scalar(uid::SCALE, FLOAT)?;
    let neg_inf = g.scalar(uid::NEG_INF, FLOAT)?;
    let scores = g.virt(FLOAT, s.score_dims(), packed(s.score_dims()))?;
    g.matmul(&q, &kt, &scores)?;
    let scaled = elementwise(g, Mode::CUDNN_POINTWISE_MUL, &[&scores, &scale], &scores)?;
    Ok([q, kt, scaled, scale, neg_inf])
}

/// Dropout's keep mask over the scores (f32, 1 with probability `1 − p`): cuDNN's Bernoulli
/// draw keyed by the seed and offset tensors in memory, as the frontend's `rng` node.
pub(crate) fn dropout_mask(g: &mut GraphBuilder, s: &SdpaGeometry, p: f64) -> CudnnResult<Node> {
    let seed = g.memory(uid::SEED, INT64, [1; 4], [1; 4])?;
    let offset = g.memory(uid::OFFSET, INT64, [1; 4], [1; 4])?;
    let mask = g.virt(FLOAT, s.score_dims(), packed(s.score_dims()))?;
    g.bernoulli(1.0 - p, &seed, &offset, &mask)?;
    Ok(mask)
}

/// The forward's plan for `io` data (bf16 or f16) in `geometry` on `handle`, with dropout of
/// probability `dropout` when given, and its workspace in bytes. Tensors: q, k, v, the scale
/// and −∞ by value (with dropout: the seed and offset in memory, the dropout scale by value);
/// out: o, stats (`[batch, heads, seq, 1]` f32, packed).
pub(crate) fn forward_plan(
    handle: sys::cudnnHandle_t,
    io: sys::cudnnDataType_t,
    geometry: &SdpaGeometry,
    dropout: Option<f64>,
) -> CudnnResult<(Descriptor, usize)> {
    let s = geometry;
    let mut g = GraphBuilder::new(100);
    let [_, _, scaled, _, neg_inf] = scaled_scores(&mut g, s, io)?;
    let v = g.memory(uid::V, io, s.kv_dims(), s.qkv_strides[2])?;
    let masked = causal_mask(&mut g, &scaled, &neg_inf)?;

    let rows = |g: &mut GraphBuilder| g.virt(FLOAT, s.row_dims(), packed(s.row_dims()));
    let max = rows(&mut g)?;
    g.reduction(MAX, &masked, &max)?;
    let shifted = elementwise(&mut g, Mode::CUDNN_POINTWISE_SUB, &[&masked, &max], &masked)?;
    let exp = elementwise(&mut g, Mode::CUDNN_POINTWISE_EXP, &[&shifted], &masked)?;
    let sum = rows(&mut g)?;
    g.reduction(SUM, &exp, &sum)?;
    let log = elementwise(&mut g, Mode::CUDNN_POINTWISE_LOG, &[&sum], &sum)?;
    let stats = g.memory(uid::STATS, FLOAT, s.row_dims(), packed(s.row_dims()))?;
    g.pointwise(
        Mode::CUDNN_POINTWISE_ADD,
        &[&max, &log],
        &stats,
        FLOAT,
        None,
    )?;
    // The weights are rounded to the data's type right before `P V`: after dropout's scale
    // when there is dropout.
    let weights = g.virt_like(&masked, if dropout.is_some() { FLOAT } else { io })?;
    g.pointwise(
        Mode::CUDNN_POINTWISE_DIV,
        &[&exp, &sum],
        &weights,
        FLOAT,
        None,
    )?;
    let weights = match dropout {
        None => weights,
        Some(p) => {
            let mask = dropout_mask(&mut g, s, p)?;
            let mul = Mode::CUDNN_POINTWISE_MUL;
            let kept = elementwise(&mut g, mul, &[&weights, &mask], &masked)?;
            let scale = g.scalar(uid::DROPOUT_SCALE, FLOAT)?;
            let dropped = g.virt_like(&masked, io)?;
            g.pointwise(mul, &[&kept, &scale], &dropped, FLOAT, None)?;
            dropped
        }
    };

    let o = g.memory(uid::O, io, s.q_dims(), s.out_strides)?;
    g.matmul(&weights, &v, &o)?;
    first_plan(handle, &g.ops())
}
