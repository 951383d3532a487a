//! cuDNN's fused causal attention (its flash-attention engines) described as the graphs
//! cudnn-frontend's composite `sdpa` and `sdpa_backward` nodes build for cuDNN 9: scores
//! `Q Kᵀ · scale` with the causal mask (row index ≥ column index, −∞ elsewhere), the softmax
//! with its per-row statistics `max + ln Σ exp` kept for the backward, the output `P V`; and the
//! backward recomputing the weights from those statistics, `Σ dO·O` per row, and `dV = Pᵀ dO`,
//! `dK = dSᵀ Q`, `dQ = dS K` with `dS = P (dP − Σ dO·O) · scale`. cuDNN recognises the pattern
//! only when every node has the frontend's types and shapes: intermediates in f32, the weights
//! in the data's type before the second product, index tensors i32 and the mask boolean.
//! Grouped-query attention reads each key/value head for its group of query heads (the
//! products broadcast over the head dimension) and sums the groups' `dK`, `dV`.

use cudarc::cudnn::result::CudnnResult;
use cudarc::cudnn::sys;

use sys::cudnnDataType_t::{
    CUDNN_DATA_BOOLEAN as BOOLEAN, CUDNN_DATA_FLOAT as FLOAT, CUDNN_DATA_INT32 as INT32,
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
    fn q_dims(&self) -> [i64; 4] {
        [self.batch, self.heads, self.seq, self.head_dim]
    }

    fn kv_dims(&self) -> [i64; 4] {
        [self.batch, self.kv_heads, self.seq, self.head_dim]
    }

    /// `[batch, heads, seq, seq]`: the scores.
    fn score_dims(&self) -> [i64; 4] {
        [self.batch, self.heads, self.seq, self.seq]
    }

    /// `[batch, heads, seq, 1]`: one value per query row.
    pub fn row_dims(&self) -> [i64; 4] {
        [self.batch, self.heads, self.seq, 1]
    }
}

/// A `[.., rows, cols]` tensor's transpose as the same memory (`Kᵀ` from `K`).
fn swapped(dims: [i64; 4], strides: [i64; 4]) -> ([i64; 4], [i64; 4]) {
    (
        [dims[0], dims[1], dims[3], dims[2]],
        [strides[0], strides[1], strides[3], strides[2]],
    )
}

/// The causal mask over `scores`: kept where the row index is at least the column index,
/// `neg_inf` elsewhere (the frontend's top-left diagonal band with right bound 0).
fn causal_mask(g: &mut GraphBuilder, scores: &Node, neg_inf: &Node) -> CudnnResult<Node> {
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
fn elementwise(
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
fn scaled_scores(
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

/// The forward's plan for `io` data (bf16 or f16) in `geometry` on `handle`, and its
/// workspace in bytes. Tensors: q, k, v, the scale and −∞ by value; out: o, stats
/// (`[batch, heads, seq, 1]` f32, packed).
pub(crate) fn forward_plan(
    handle: sys::cudnnHandle_t,
    io: sys::cudnnDataType_t,
    geometry: &SdpaGeometry,
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
    let weights = g.virt_like(&masked, io)?;
    g.pointwise(
        Mode::CUDNN_POINTWISE_DIV,
        &[&exp, &sum],
        &weights,
        FLOAT,
        None,
    )?;

    let o = g.memory(uid::O, io, s.q_dims(), s.out_strides)?;
    g.matmul(&weights, &v, &o)?;
    first_plan(handle, &g.ops())
}

/// A key/value gradient: `a b` into `uid` (`[batch, kv_heads, seq, head_dim]` at the k or v
/// strides), through a full-head product summed over each group of query heads when there are
/// fewer key/value heads.
fn kv_gradient(
    g: &mut GraphBuilder,
    s: &SdpaGeometry,
    io: sys::cudnnDataType_t,
    (a, b): (&Node, &Node),
    (uid, strides): (i64, [i64; 4]),
) -> CudnnResult<()> {
    let out = g.memory(uid, io, s.kv_dims(), strides)?;
    if s.kv_heads == s.heads {
        return g.matmul(a, b, &out);
    }
    let full = g.virt(io, s.q_dims(), packed(s.q_dims()))?;
    g.matmul(a, b, &full)?;
    g.reduction(SUM, &full, &out)
}

/// The backward's plan for `io` data in `geometry` on `handle`, and its workspace in bytes.
/// Tensors: q, k, v, o, dO, stats, the scale, −∞ and 1 by value, the per-row `Σ dO·O`
/// (`[batch, heads, seq, 1]` f32) and, unless `deterministic`, the f32 `dQ` accumulator
/// (`[batch, heads, seq, head_dim]`, packed): both in scratch memory of the caller's; out: dQ,
/// dK, dV. `deterministic` takes cuDNN's workspace variant, whose `dQ` is written by one
/// product (the frontend's `use_dp_workspace`) instead of accumulated across blocks.
/// `k_view_type` is the type given to the view of K read by the `dQ` product.
pub(crate) fn backward_plan(
    handle: sys::cudnnHandle_t,
    io: sys::cudnnDataType_t,
    geometry: &SdpaGeometry,
    deterministic: bool,
    k_view_type: sys::cudnnDataType_t,
) -> CudnnResult<(Descriptor, usize)> {
    let s = geometry;
    let mut g = GraphBuilder::new(100);
    let (vt_dims, vt_strides) = swapped(s.kv_dims(), s.qkv_strides[2]);
    let vt = g.memory(uid::V, io, vt_dims, vt_strides)?;
    let o = g.memory(uid::O, io, s.q_dims(), s.out_strides)?;
    let d_o = g.memory(uid::D_O, io, s.q_dims(), s.out_strides)?;
    let stats = g.memory(uid::STATS, FLOAT, s.row_dims(), packed(s.row_dims()))?;
    let one = g.scalar(uid::ONE, FLOAT)?;

    // Σ dO·O per row (the frontend's softmax_sum), kept in memory for the dP chain.
    let [_, h, t, d] = s.q_dims();
    let products = g.virt(FLOAT, s.q_dims(), [h * t * d, t * d, h * d, 1])?;
    g.pointwise(
        Mode::CUDNN_POINTWISE_MUL,
        &[&d_o, &o],
        &products,
        FLOAT,
        None,
    )?;
    let dots = g.virt(FLOAT, s.row_dims(), packed(s.row_dims()))?;
    g.reduction(SUM, &products, &dots)?;
    let row_dot = g.memory(uid::ROW_DOT, FLOAT, s.row_dims(), packed(s.row_dims()))?;
    g.pointwise(
        Mode::CUDNN_POINTWISE_MUL,
        &[&dots, &one],
        &row_dot,
        FLOAT,
        None,
    )?;

    // The weights P again, from the saved statistics; dV = Pᵀ dO. (The operations in the
    // frontend's order: the Σ dO·O chain first.)
    let [q, kt, scores, scale, neg_inf] = scaled_scores(&mut g, s, io)?;
    let centred = elementwise(
        &mut g,
        Mode::CUDNN_POINTWISE_SUB,
        &[&scores, &stats],
        &scores,
    )?;
    let masked = causal_mask(&mut g, &centred, &neg_inf)?;
    let weights = elementwise(&mut g, Mode::CUDNN_POINTWISE_EXP, &[&masked], &scores)?;
    let transposed = [h * t * t, t * t, 1, t];
    let weights_t = g.virt(io, s.score_dims(), transposed)?;
    g.reshape(&weights, &weights_t)?;
    kv_gradient(
        &mut g,
        s,
        io,
        (&weights_t, &d_o),
        (uid::D_V, s.qkv_strides[2]),
    )?;

    // dS = P (dO Vᵀ − Σ dO·O) · scale; dK = dSᵀ Q.
    let d_p = g.virt(FLOAT, s.score_dims(), packed(s.score_dims()))?;
    g.matmul(&d_o, &vt, &d_p)?;
    let sub = Mode::CUDNN_POINTWISE_SUB;
    let d_p = elementwise(&mut g, sub, &[&d_p, &row_dot], &scores)?;
    let d_p = elementwise(
        &mut g,
        Mode::CUDNN_POINTWISE_MUL,
        &[&d_p, &weights],
        &scores,
    )?;
    let d_s = elementwise(&mut g, Mode::CUDNN_POINTWISE_MUL, &[&d_p, &scale], &scores)?;
    let d_s_t = g.virt(io, s.score_dims(), transposed)?;
    g.reshape(&d_s, &d_s_t)?;
    kv_gradient(&mut g, s, io, (&d_s_t, &q), (uid::D_K, s.qkv_strides[1]))?;

    // dQ = dS K, through an f32 accumulator unless deterministic.
    let k = g.virt(k_view_type, s.kv_dims(), s.qkv_strides[1])?;
    g.reshape(&kt, &k)?;
    let d_q = g.memory(uid::D_Q, io, s.q_dims(), s.qkv_strides[0])?;
    if deterministic {
        g.matmul(&d_s, &k, &d_q)?;
    } else {
        let accum = g.memory(uid::DQ_ACCUM, FLOAT, s.q_dims(), packed(s.q_dims()))?;
        g.matmul(&d_s, &k, &accum)?;
        let identity = Mode::CUDNN_POINTWISE_IDENTITY;
        g.pointwise(identity, &[&accum], &d_q, FLOAT, None)?;
    }
    first_plan(handle, &g.ops())
}
