//! Runs cuDNN's fused causal attention (`sdpa_graph`, `sdpa_graph_backward`) on packed
//! projections: queries, keys and values read in place from the rows of one
//! `[batch · seq, (heads + 2 kv_heads) · head_dim]` tensor (a fused q | k | v projection, as
//! llm.c passes them), the output written as `[batch · seq, heads · head_dim]` rows and the
//! gradients of q, k and v into one tensor of the projection's layout: no head split,
//! transpose or concatenation around the kernels. Optionally with dropout of the attention
//! weights, drawn by cuDNN from a Philox seed and offset in device memory.
//!
//! Plans are cached per thread (`sdpa_support`; the engines compile at run time, about a second
//! each, so a warm-up step pays for them); a configuration cuDNN has no engine for makes the
//! caller take its own path. The backward is cuDNN's deterministic variant under
//! [`super::determinism::deterministic`], its faster accumulating one otherwise.

use std::ffi::c_void;
use std::rc::Rc;

use candle_core::cuda::{CudaDType, CudaDevice};
use candle_core::{DType, Result, Shape, Tensor};
use cudarc::cudnn::sys;
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};

use super::conv_cudnn::handle;
use super::packed_attention::PackedHeads;
use super::sdpa_graph::{forward_plan, uid, SdpaGeometry};
use super::sdpa_graph_backward::{backward_plan, BackwardVariant};
use super::sdpa_support::{
    address, aligned, io_type, plan_for, run, scratch, wrap, zero_accumulator, Key, Plan,
};

/// The cuDNN geometry of `batch` sequences of `seq` tokens of packed `heads`.
fn geometry(heads: PackedHeads, batch: usize, seq: usize) -> SdpaGeometry {
    let (row, out, d) = (
        heads.row_width() as i64,
        heads.out_width() as i64,
        heads.head_dim as i64,
    );
    let t = seq as i64;
    SdpaGeometry {
        batch: batch as i64,
        heads: heads.heads as i64,
        kv_heads: heads.kv_heads as i64,
        seq: t,
        head_dim: d,
        qkv_strides: [[t * row, d, row, 1]; 3],
        out_strides: [t * out, d, out, 1],
    }
}

/// Dropout of the attention weights inside a fused pass: the probability of dropping one, and
/// the device tensor (four i64) whose elements 0 and 2 are the Philox seed and offset the
/// forward and its backward both read (the same mask).
#[derive(Clone, Copy)]
pub(crate) struct FusedDropout<'a> {
    pub p: f64,
    pub philox: &'a Tensor,
}

impl FusedDropout<'_> {
    /// The device addresses of the seed and the offset (16 bytes apart: each on the 16 bytes
    /// the graphs declare).
    fn addresses(&self) -> Result<Option<[u64; 2]>> {
        if self.philox.dtype() != DType::I64 || self.philox.elem_count() != 4 {
            candle_core::bail!("fused attention dropout: the Philox state must be four i64");
        }
        Ok(address::<i64>(self.philox)?.map(|(_, at)| [at, at + 16]))
    }
}

/// The backward's plan for `dtype` data in `geometry` with `dropout`, in the variant
/// [`super::determinism::deterministic`] asks for now.
fn backward_plan_now(
    device: &CudaDevice,
    dtype: DType,
    geometry: SdpaGeometry,
    dropout: Option<f64>,
) -> Result<Option<(Rc<Plan>, bool)>> {
    let Some(io) = io_type(dtype) else {
        return Ok(None);
    };
    let deterministic = super::determinism::deterministic();
    let key = Key {
        forward: false,
        dtype,
        geometry,
        deterministic,
        dropout: dropout.map(f64::to_bits),
    };
    let cudnn = handle(&device.cuda_stream())?;
    let plan = plan_for(key, || {
        // The frontend types the view of K read by the dQ product as an intermediate (f32);
        // should this cuDNN refuse it, the data's own type.
        let float = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
        let variant = |k_view_type| BackwardVariant {
            deterministic,
            k_view_type,
            dropout,
        };
        backward_plan(cudnn.0, io, &geometry, variant(float))
            .or_else(|_| backward_plan(cudnn.0, io, &geometry, variant(io)))
    });
    Ok(plan.map(|plan| (plan, deterministic)))
}

/// The fused forward of `qkv` (`[batch, seq, row_width]`, bf16/f16, contiguous, on a GPU),
/// with `dropout` of the weights when given: the output (`[batch, seq, heads · head_dim]`) and
/// each query row's log-sum-exp of its scaled, masked scores (`[batch, heads, seq]`, f32);
/// `None` where cuDNN does not apply (with dropout: unless cuDNN has the backward too, which
/// alone can draw the same mask again).
pub(crate) fn forward(
    qkv: &Tensor,
    heads: PackedHeads,
    dropout: Option<FusedDropout<'_>>,
) -> Result<Option<(Tensor, Tensor)>> {
    match qkv.dtype() {
        DType::BF16 => forward_typed::<half::bf16>(qkv, heads, dropout),
        DType::F16 => forward_typed::<half::f16>(qkv, heads, dropout),
        _ => Ok(None),
    }
}

fn forward_typed<T: CudaDType + DeviceRepr>(
    qkv: &Tensor,
    heads: PackedHeads,
    dropout: Option<FusedDropout<'_>>,
) -> Result<Option<(Tensor, Tensor)>> {
    let (batch, seq, _) = qkv.dims3()?;
    let Some((device, base)) = address::<T>(qkv)? else {
        return Ok(None);
    };
    let geometry = geometry(heads, batch, seq);
    let io = io_type(qkv.dtype()).expect("a 16-bit type");
    let p = dropout.map(|d| d.p);
    let key = Key {
        forward: true,
        dtype: qkv.dtype(),
        geometry,
        deterministic: false,
        dropout: p.map(f64::to_bits),
    };
    let cudnn = handle(&device.cuda_stream())?;
    let Some(plan) = plan_for(key, || forward_plan(cudnn.0, io, &geometry, p)) else {
        return Ok(None);
    };
    if p.is_some() && backward_plan_now(&device, qkv.dtype(), geometry, p)?.is_none() {
        return Ok(None);
    }
    let philox = match dropout {
        Some(d) => match d.addresses()? {
            Some(at) => Some(at),
            None => return Ok(None),
        },
        None => None,
    };
    let rows = batch * seq;
    // SAFETY: cuDNN writes every element of the output and of the statistics.
    let out: CudaSlice<T> = unsafe { device.alloc::<T>(rows * heads.out_width())? };
    let stats: CudaSlice<f32> = unsafe { device.alloc::<f32>(rows * heads.heads)? };
    let stream = device.cuda_stream();
    let (out_at, _) = out.device_ptr(&stream);
    let (stats_at, _) = stats.device_ptr(&stream);
    let (_scratch, starts) = scratch(&device, plan.workspace, &[])?;
    let element = std::mem::size_of::<T>() as u64;
    let [q, k, v] = heads.offsets().map(|o| base + o as u64 * element);
    if !aligned(&[q, k, v, out_at, stats_at]) {
        return Ok(None);
    }
    let mut scalars = [
        1.0 / (heads.head_dim as f32).sqrt(),
        f32::NEG_INFINITY,
        p.map_or(1.0, |p| (1.0 / (1.0 - p)) as f32),
    ];
    let [scale, neg_inf, dropout_scale] = scalars.each_mut().map(|x| x as *mut f32 as *mut c_void);
    let at = |p: u64| p as *mut c_void;
    let mut uids = vec![
        uid::Q,
        uid::K,
        uid::V,
        uid::O,
        uid::STATS,
        uid::SCALE,
        uid::NEG_INF,
    ];
    let mut pointers = vec![
        at(q),
        at(k),
        at(v),
        at(out_at),
        at(stats_at),
        scale,
        neg_inf,
    ];
    if let Some([seed, offset]) = philox {
        uids.extend([uid::SEED, uid::OFFSET, uid::DROPOUT_SCALE]);
        pointers.extend([at(seed), at(offset), dropout_scale]);
    }
    run(&plan, &device, &uids, &pointers, starts[0])?;
    let out = wrap(out, &device, Shape::from((batch, seq, heads.out_width())));
    let stats = wrap(stats, &device, Shape::from((batch, heads.heads, seq)));
    Ok(Some((out, stats)))
}

/// The gradient of the packed projection (`[batch, seq, row_width]`) from `qkv`, the forward's
/// `out` and `lse`, the output's gradient `d_out` and the forward's `dropout`; `None` where
/// cuDNN does not apply.
pub(crate) fn backward(
    qkv: &Tensor,
    out: &Tensor,
    lse: &Tensor,
    d_out: &Tensor,
    heads: PackedHeads,
    dropout: Option<FusedDropout<'_>>,
) -> Result<Option<Tensor>> {
    let saved = Saved { out, lse, d_out };
    match qkv.dtype() {
        DType::BF16 => backward_typed::<half::bf16>(qkv, saved, heads, dropout),
        DType::F16 => backward_typed::<half::f16>(qkv, saved, heads, dropout),
        _ => Ok(None),
    }
}

/// The forward's output and log-sum-exp, and the output's gradient.
struct Saved<'a> {
    out: &'a Tensor,
    lse: &'a Tensor,
    d_out: &'a Tensor,
}

fn backward_typed<T: CudaDType + DeviceRepr>(
    qkv: &Tensor,
    Saved { out, lse, d_out }: Saved<'_>,
    heads: PackedHeads,
    dropout: Option<FusedDropout<'_>>,
) -> Result<Option<Tensor>> {
    let (batch, seq, _) = qkv.dims3()?;
    if lse.dtype() != DType::F32 || out.dtype() != qkv.dtype() || d_out.dtype() != qkv.dtype() {
        return Ok(None);
    }
    let addresses = (
        address::<T>(qkv)?,
        address::<T>(out)?,
        address::<f32>(lse)?,
        address::<T>(d_out)?,
    );
    let (Some((device, base)), Some((_, out_at)), Some((_, lse_at)), Some((_, d_out_at))) =
        addresses
    else {
        return Ok(None);
    };
    let philox = match dropout {
        Some(d) => match d.addresses()? {
            Some(at) => Some(at),
            None => return Ok(None),
        },
        None => None,
    };
    let p = dropout.map(|d| d.p);
    let geometry = geometry(heads, batch, seq);
    let Some((plan, deterministic)) = backward_plan_now(&device, qkv.dtype(), geometry, p)? else {
        return Ok(None);
    };
    let rows = batch * seq;
    // SAFETY: cuDNN writes every element of dQ, dK and dV, which tile the packed rows.
    let d_qkv: CudaSlice<T> = unsafe { device.alloc::<T>(rows * heads.row_width())? };
    let stream = device.cuda_stream();
    let (d_at, _) = d_qkv.device_ptr(&stream);
    let row_values = rows * heads.heads;
    let accumulator = match deterministic {
        true => 0,
        false => row_values * heads.head_dim,
    };
    let (mut scratch_buffer, starts) =
        scratch(&device, plan.workspace, &[row_values, accumulator])?;
    if !deterministic && zero_accumulator() {
        let start = (starts[2] - starts[0]) as usize;
        let mut region = scratch_buffer.slice_mut(start..start + 4 * accumulator);
        stream
            .memset_zeros(&mut region)
            .map_err(|e| candle_core::Error::Msg(format!("{e:?}")))?;
    }
    let element = std::mem::size_of::<T>() as u64;
    let [q, k, v] = heads.offsets().map(|o| base + o as u64 * element);
    let [dq, dk, dv] = heads.offsets().map(|o| d_at + o as u64 * element);
    if !aligned(&[q, k, v, out_at, d_out_at, lse_at, dq, dk, dv]) {
        return Ok(None);
    }
    let keep = p.map_or(1.0, |p| 1.0 - p);
    let mut scalars = [
        1.0 / (heads.head_dim as f32).sqrt(),
        f32::NEG_INFINITY,
        keep as f32,
        (1.0 / keep) as f32,
    ];
    let [scale, neg_inf, row_factor, dropout_scale] =
        scalars.each_mut().map(|x| x as *mut f32 as *mut c_void);
    let at = |p: u64| p as *mut c_void;
    let mut uids = vec![
        uid::Q,
        uid::K,
        uid::V,
        uid::O,
        uid::D_O,
        uid::STATS,
        uid::D_Q,
        uid::D_K,
        uid::D_V,
        uid::SCALE,
        uid::NEG_INF,
        uid::ROW_DOT,
    ];
    let mut pointers = vec![
        at(q),
        at(k),
        at(v),
        at(out_at),
        at(d_out_at),
        at(lse_at),
        at(dq),
        at(dk),
        at(dv),
        scale,
        neg_inf,
        at(starts[1]),
    ];
    match philox {
        Some([seed, offset]) => {
            uids.extend([
                uid::SEED,
                uid::OFFSET,
                uid::DROPOUT_SCALE,
                uid::DROPOUT_SCALE_INV,
            ]);
            pointers.extend([at(seed), at(offset), dropout_scale, row_factor]);
        }
        None => {
            uids.push(uid::ONE);
            pointers.push(row_factor);
        }
    }
    if !deterministic {
        uids.push(uid::DQ_ACCUM);
        pointers.push(at(starts[2]));
    }
    run(&plan, &device, &uids, &pointers, starts[0])?;
    Ok(Some(wrap(
        d_qkv,
        &device,
        Shape::from((batch, seq, heads.row_width())),
    )))
}
