//! The backward graph of cuDNN's fused causal attention, as cudnn-frontend's `sdpa_backward`
//! node builds it: the weights `P` recomputed from the forward's statistics, `Σ dO·O` per row,
//! `dV = Pᵀ dO`, `dS = P (dO Vᵀ − Σ dO·O) · scale`, `dK = dSᵀ Q` and `dQ = dS K` (grouped-query
//! heads' `dK`, `dV` summed over each group). With dropout the mask is drawn again first from
//! the forward's seed and offset (the same Philox stream: the same mask), `dV` is taken from the
//! dropped weights `P ∘ M / (1 − p)`, `dP` is masked and scaled, and `Σ dO·O` is scaled by
//! `1 − p` to match (the frontend's order and types throughout).

use cudarc::cudnn::result::CudnnResult;
use cudarc::cudnn::sys;

use sys::cudnnDataType_t::CUDNN_DATA_FLOAT as FLOAT;
use sys::cudnnPointwiseMode_t as Mode;
use sys::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_ADD as SUM;

use super::cudnn_backend::{first_plan, Descriptor};
use super::cudnn_graph::{packed, GraphBuilder, Node};
use super::sdpa_graph::{
    causal_mask, dropout_mask, elementwise, scaled_scores, swapped, uid, SdpaGeometry,
};

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

/// How the backward is built: cuDNN's deterministic variant or not, the type of the view of K
/// read by the `dQ` product, and the dropout probability of the forward (if any).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BackwardVariant {
    pub deterministic: bool,
    pub k_view_type: sys::cudnnDataType_t,
    pub dropout: Option<f64>,
}

/// The backward's plan for `io` data in `geometry` on `handle`, and its workspace in bytes.
/// Tensors: q, k, v, o, dO, stats, the scale and −∞ by value, 1 by value (with dropout: the
/// seed and offset in memory, the dropout scale and its inverse by value instead), the per-row
/// `Σ dO·O` (`[batch, heads, seq, 1]` f32) and, unless deterministic, the f32 `dQ` accumulator
/// (`[batch, heads, seq, head_dim]`, packed): both in scratch memory of the caller's; out: dQ,
/// dK, dV. The deterministic variant is cuDNN's workspace one, whose `dQ` is written by one
/// product (the frontend's `use_dp_workspace`) instead of accumulated across blocks.
pub(crate) fn backward_plan(
    handle: sys::cudnnHandle_t,
    io: sys::cudnnDataType_t,
    geometry: &SdpaGeometry,
    variant: BackwardVariant,
) -> CudnnResult<(Descriptor, usize)> {
    let s = geometry;
    let mut g = GraphBuilder::new(100);
    // The frontend draws the mask before anything else.
    let mask = variant
        .dropout
        .map(|p| dropout_mask(&mut g, s, p))
        .transpose()?;
    let (vt_dims, vt_strides) = swapped(s.kv_dims(), s.qkv_strides[2]);
    let vt = g.memory(uid::V, io, vt_dims, vt_strides)?;
    let o = g.memory(uid::O, io, s.q_dims(), s.out_strides)?;
    let d_o = g.memory(uid::D_O, io, s.q_dims(), s.out_strides)?;
    let stats = g.memory(uid::STATS, FLOAT, s.row_dims(), packed(s.row_dims()))?;
    let (row_factor, dropout_scale) = match mask {
        Some(_) => (
            g.scalar(uid::DROPOUT_SCALE_INV, FLOAT)?,
            Some(g.scalar(uid::DROPOUT_SCALE, FLOAT)?),
        ),
        None => (g.scalar(uid::ONE, FLOAT)?, None),
    };

    // Σ dO·O per row (the frontend's softmax_sum; times 1 − p with dropout), kept in memory
    // for the dP chain.
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
        &[&dots, &row_factor],
        &row_dot,
        FLOAT,
        None,
    )?;

    // The weights P again, from the saved statistics; dV = Pᵀ dO (P dropped and scaled with
    // dropout). (The operations in the frontend's order: the Σ dO·O chain first.)
    let mul = Mode::CUDNN_POINTWISE_MUL;
    let [q, kt, scores, scale, neg_inf] = scaled_scores(&mut g, s, io)?;
    let centred = elementwise(
        &mut g,
        Mode::CUDNN_POINTWISE_SUB,
        &[&scores, &stats],
        &scores,
    )?;
    let masked = causal_mask(&mut g, &centred, &neg_inf)?;
    let weights = elementwise(&mut g, Mode::CUDNN_POINTWISE_EXP, &[&masked], &scores)?;
    let dropped = match (&mask, &dropout_scale) {
        (Some(mask), Some(factor)) => {
            let kept = elementwise(&mut g, mul, &[&weights, mask], &scores)?;
            elementwise(&mut g, mul, &[&kept, factor], &scores)?
        }
        _ => weights,
    };
    let transposed = [h * t * t, t * t, 1, t];
    let dropped_t = g.virt(io, s.score_dims(), transposed)?;
    g.reshape(&dropped, &dropped_t)?;
    kv_gradient(
        &mut g,
        s,
        io,
        (&dropped_t, &d_o),
        (uid::D_V, s.qkv_strides[2]),
    )?;

    // dS = P (dO Vᵀ − Σ dO·O) · scale (with dropout: P (dO Vᵀ ∘ M − (1 − p) Σ dO·O) / (1 − p)
    // · scale); dK = dSᵀ Q.
    let d_p = g.virt(FLOAT, s.score_dims(), packed(s.score_dims()))?;
    g.matmul(&d_o, &vt, &d_p)?;
    let d_p = match &mask {
        Some(mask) => elementwise(&mut g, mul, &[&d_p, mask], &scores)?,
        None => d_p,
    };
    let sub = Mode::CUDNN_POINTWISE_SUB;
    let d_p = elementwise(&mut g, sub, &[&d_p, &row_dot], &scores)?;
    let mut d_p = elementwise(&mut g, mul, &[&d_p, &weights], &scores)?;
    if let Some(factor) = &dropout_scale {
        d_p = elementwise(&mut g, mul, &[&d_p, factor], &scores)?;
    }
    let d_s = elementwise(&mut g, mul, &[&d_p, &scale], &scores)?;
    let d_s_t = g.virt(io, s.score_dims(), transposed)?;
    g.reshape(&d_s, &d_s_t)?;
    kv_gradient(&mut g, s, io, (&d_s_t, &q), (uid::D_K, s.qkv_strides[1]))?;

    // dQ = dS K, through an f32 accumulator unless deterministic.
    let k = g.virt(variant.k_view_type, s.kv_dims(), s.qkv_strides[1])?;
    g.reshape(&kt, &k)?;
    let d_q = g.memory(uid::D_Q, io, s.q_dims(), s.qkv_strides[0])?;
    if variant.deterministic {
        g.matmul(&d_s, &k, &d_q)?;
    } else {
        let accum = g.memory(uid::DQ_ACCUM, FLOAT, s.q_dims(), packed(s.q_dims()))?;
        g.matmul(&d_s, &k, &accum)?;
        let identity = Mode::CUDNN_POINTWISE_IDENTITY;
        g.pointwise(identity, &[&accum], &d_q, FLOAT, None)?;
    }
    first_plan(handle, &g.ops())
}
