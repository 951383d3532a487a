//! Attention dropout inside cuDNN's fused attention (`ops::packed_attention_with_dropout`, bf16
//! and f16). cuDNN's masks are its own, so the checks are of their statistics and of the
//! forward and backward agreeing with one another:
//!
//! - **The mask read out.** With q = k = 0 every allowed weight of row i is 1/(i + 1), and with
//!   v the identity (T = head width = 128) the output *is* the dropped weights: `O[i, j] =
//!   M[i, j] / ((1 − p)(i + 1))`. Its kept fraction is 1 − p within 5 binomial standard
//!   deviations over the 4 × 8 × 8,256 allowed weights (σ = 5.8e-4 at p = 0.1); each kept value
//!   is 1/((1 − p)(i + 1)) within 2 units of the type's rounding step; different heads draw
//!   independent masks (the share of allowed weights two heads keep or drop alike is
//!   (1 − p)² + p² = 0.82 for independent masks, 1 for copies: at most 0.85; σ = 0.002 over
//!   the 33,024 allowed weights of two heads). With the output's
//!   gradient the identity too, `dV = P_dropᵀ dO` reads out the backward's mask: it must be the
//!   forward's, element for element.
//! - **Forward and backward exactly, with that mask.** On random data with the same seed (the
//!   mask depends on the seed and the geometry, not on the data), the output and dq, dk, dv
//!   against the CPU in f64 applying the read-out mask (tolerances of the fused attention's
//!   rows: 4 and 8 units of the rounding step, relative to each tensor's largest value).
//! - **Scaling.** The mean of N = 64 outputs under 64 seeds against the exact output without
//!   dropout: z = (mean − exact) / sqrt(Var / N) with `Var = p/(1 − p) Σⱼ P²ᵢⱼ v²ⱼ` per element;
//!   mean(z²) must be within 0.2 of 1 (its standard deviation is at most 0.03 here; a missing
//!   1/(1 − p) scale gives mean(z²) ≈ 6).
//! - **cuDNN's deterministic backward** (`--deterministic`): the mask rows and the exact rows
//!   again in bf16 (its backward is another engine, which must draw the same mask).
//! - **Seeds.** The same seed twice gives the same bits; another step value
//!   (`ops::set_dropout_step`) or another seed gives another output (at most 20 % of the
//!   elements equal). The CUDA-graph rows are in [`super::attention_dropout_graph`].

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor, Var, D};
use weft_tensor::ops::dropout::Dropout;
use weft_tensor::ops::{self, PackedHeads};

use super::single_ops::relative_error;
use super::Check;

pub(super) const P: f64 = 0.1;
/// Batch, sequence = head width (the identity as v), heads.
pub(super) const READOUT: (usize, usize, usize) = (4, 128, 8);

pub(super) fn heads(h: usize, d: usize) -> PackedHeads {
    PackedHeads {
        heads: h,
        kv_heads: h,
        head_dim: d,
    }
}

/// The fused attention with dropout of `qkv` (on the GPU) and, given `d_out`, the gradient of
/// `qkv`; an error where cuDNN refused.
pub(super) fn fused(
    qkv: &Tensor,
    d_out: Option<&Tensor>,
    h: PackedHeads,
    seed: u64,
) -> Result<(Tensor, Option<Tensor>)> {
    // The step's value is the device's (ops::set_dropout_step); the host's copy is unused here.
    let dropout = Dropout {
        p: P,
        seed,
        step: 0,
        placement: None,
    };
    let var = Var::from_tensor(qkv)?;
    let out = ops::packed_attention_with_dropout(var.as_tensor(), h, &dropout)?
        .context("cuDNN's fused attention refused dropout for this geometry")?;
    let Some(d_out) = d_out else {
        return Ok((out, None));
    };
    let grads = (&out * d_out)?.sum_all()?.backward()?;
    let d_qkv = grads.get(var.as_tensor()).context("no gradient")?.clone();
    Ok((out, Some(d_qkv)))
}

/// `[B, T, count · d]` to `[B, count, T, d]`, in f64 on the CPU.
pub(super) fn split_heads(x: &Tensor, count: usize, d: usize) -> Result<Tensor> {
    let (b, t, _) = x.dims3()?;
    let x = x.to_device(&Device::Cpu)?.to_dtype(DType::F64)?;
    Ok(x.reshape((b, t, count, d))?.transpose(1, 2)?.contiguous()?)
}

/// q = k = 0 and v the identity of each head, `[B, T, 3 · heads · T]`; and the identity as
/// the output's gradient, `[B, T, heads · T]`.
pub(super) fn readout_inputs(dtype: DType, gpu: &Device) -> Result<(Tensor, Tensor)> {
    let (b, t, h) = READOUT;
    let eye = Tensor::eye(t, DType::F32, &Device::Cpu)?;
    let per_head = eye
        .unsqueeze(1)?
        .broadcast_as((t, h, t))?
        .reshape((t, h * t))?;
    let identity = per_head
        .unsqueeze(0)?
        .broadcast_as((b, t, h * t))?
        .contiguous()?;
    let zeros = Tensor::zeros((b, t, 2 * h * t), DType::F32, &Device::Cpu)?;
    let qkv = Tensor::cat(&[&zeros, &identity], 2)?;
    let on_gpu = |x: &Tensor| -> Result<Tensor> { Ok(x.to_dtype(dtype)?.to_device(gpu)?) };
    Ok((on_gpu(&qkv)?, on_gpu(&identity)?))
}

/// The forward's dropped weights `[B, H, T, T]` from its output, and the backward's from `dV`.
pub(super) fn read_masks(out: &Tensor, d_qkv: &Tensor) -> Result<(Tensor, Tensor)> {
    let (_, t, h) = READOUT;
    let forward = split_heads(out, h, t)?;
    let dv = split_heads(&d_qkv.narrow(2, 2 * h * t, h * t)?, h, t)?;
    Ok((forward, dv.transpose(2, 3)?.contiguous()?))
}

/// 1 where `x` > 0, else 0.
pub(super) fn kept(x: &Tensor) -> Result<Tensor> {
    Ok(x.gt(0.0)?.to_dtype(DType::F64)?)
}

/// Elements of `a` and `b` that differ (as f64 values).
pub(super) fn differing(a: &Tensor, b: &Tensor) -> Result<f64> {
    let ne = a.to_dtype(DType::F64)?.ne(&b.to_dtype(DType::F64)?)?;
    Ok(ne.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?)
}

/// The share of equal elements of `a` and `b`.
pub(super) fn equal_share(a: &Tensor, b: &Tensor) -> Result<f64> {
    Ok(1.0 - differing(a, b)? / a.elem_count() as f64)
}

/// The share of the allowed weights (j ≤ i) that masks `a` and `b` (`[.., T, T]`, 0 above the
/// diagonal in both) keep or drop alike.
pub(super) fn mask_agreement(a: &Tensor, b: &Tensor) -> Result<f64> {
    let t = a.dim(D::Minus1)?;
    let allowed = (a.elem_count() / (t * t) * t * (t + 1) / 2) as f64;
    Ok(1.0 - differing(a, b)? / allowed)
}

/// The rows of the read-out mask; returns the mask (`[B, H, T, T]`, 0/1, f64).
fn readout_rows(gpu: &Device, dtype: DType, rows: &mut Vec<Check>) -> Result<Tensor> {
    let variant = variant();
    let (b, t, h) = READOUT;
    let (qkv, identity) = readout_inputs(dtype, gpu)?;
    let (out, d_qkv) = fused(&qkv, Some(&identity), heads(h, t), 11)?;
    let (weights, backward) = read_masks(&out, &d_qkv.context("gradient")?)?;
    let mask = kept(&weights)?;
    let allowed = (b * h * t * (t + 1) / 2) as f64;
    let kept_share = mask.sum_all()?.to_scalar::<f64>()? / allowed;
    let sigma = (P * (1.0 - P) / allowed).sqrt();
    // Each kept weight against 1/((1 − p)(i + 1)); dropped ones count 0.
    let rows_index: Vec<f64> = (0..t).map(|i| 1.0 / ((1.0 - P) * (i + 1) as f64)).collect();
    let expected = Tensor::from_vec(rows_index, (1, 1, t, 1), &Device::Cpu)?;
    let scaled = (weights.broadcast_div(&expected)? - &mask)?.abs()?;
    let scale_error = scaled.flatten_all()?.max(0)?.to_scalar::<f64>()?;
    let unit = unit(dtype);
    let agree = mask_agreement(&mask.narrow(1, 0, 1)?, &mask.narrow(1, 1, 1)?)?;
    let name = format!("{dtype:?} attention dropout (cuDNN{variant}) p {P}, b{b} T{t} heads {h}");
    rows.push(check(
        format!("{name}: kept share − (1 − p), 5 sigma"),
        (kept_share - (1.0 - P)).abs(),
        5.0 * sigma,
    ));
    rows.push(check(
        format!("{name}: kept weights / (1/((1 − p)(i+1))) − 1"),
        scale_error,
        2.0 * unit,
    ));
    rows.push(check(
        format!("{name}: heads 0 and 1 masks' agreement (0.82 expected)"),
        agree,
        0.85,
    ));
    rows.push(check(
        format!("{name}: backward's mask (from dV) ≠ forward's, elements"),
        differing(&mask, &kept(&backward)?)?,
        0.0,
    ));
    Ok(mask)
}

/// The backward's variant, for the rows' names.
fn variant() -> &'static str {
    match ops::deterministic() {
        true => ", deterministic backward",
        false => "",
    }
}

pub(super) fn unit(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2f64.powi(-8),
        _ => 2f64.powi(-11),
    }
}

pub(super) fn check(name: String, error: f64, tolerance: f64) -> Check {
    Check {
        name,
        error,
        tolerance,
    }
}

/// The weights `softmax(q kᵀ / sqrt(d) + causal mask)` of `[B, H, T, d]` q and k, in f64.
pub(super) fn weights(q: &Tensor, k: &Tensor) -> Result<Tensor> {
    let (_, _, t, d) = q.dims4()?;
    let causal: Vec<f64> = (0..t * t)
        .map(|i| {
            if i % t > i / t {
                f64::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    let causal = Tensor::from_vec(causal, (t, t), &Device::Cpu)?;
    let s = (q.matmul(&k.t()?)? / (d as f64).sqrt())?.broadcast_add(&causal)?;
    let exp = s.broadcast_sub(&s.max_keepdim(D::Minus1)?)?.exp()?;
    Ok(exp.broadcast_div(&exp.sum_keepdim(D::Minus1)?)?)
}

/// The forward and backward on the CPU in f64 with the mask `keep` (`[B, H, T, T]`, 0/1):
/// the output and the gradients of q, k, v, each `[B, H, T, d]`.
fn reference(qkv: &Tensor, d_out: &Tensor, keep: &Tensor, h: usize) -> Result<[Tensor; 4]> {
    let d = qkv.dim(2)? / (3 * h);
    let part = |i: usize| split_heads(&qkv.narrow(2, i * h * d, h * d)?, h, d);
    let (q, k, v) = (part(0)?, part(1)?, part(2)?);
    let g = split_heads(d_out, h, d)?;
    let p = weights(&q, &k)?;
    let factor = (keep / (1.0 - P))?;
    let dropped = (&p * &factor)?;
    let out = dropped.matmul(&v)?;
    let dv = dropped.t()?.matmul(&g)?;
    let dp = (g.matmul(&v.t()?)? * &factor)?;
    let row_dot = (&dp * &p)?.sum_keepdim(D::Minus1)?;
    let ds = (&p * dp.broadcast_sub(&row_dot)?)?;
    let scale = 1.0 / (d as f64).sqrt();
    let dq = (ds.matmul(&k)? * scale)?;
    let dk = (ds.t()?.matmul(&q)? * scale)?;
    Ok([out, dq, dk, dv])
}

/// The forward and backward on random data against [`reference`] with the read-out mask.
fn exact_rows(gpu: &Device, dtype: DType, keep: &Tensor, rows: &mut Vec<Check>) -> Result<()> {
    let (b, t, h) = READOUT;
    let round = |x: Tensor| -> Result<Tensor> { Ok(x.to_dtype(dtype)?.to_dtype(DType::F32)?) };
    let qkv = round(Tensor::randn(0f32, 1.0, (b, t, 3 * h * t), &Device::Cpu)?)?;
    let d_out = round(Tensor::randn(0f32, 1.0, (b, t, h * t), &Device::Cpu)?)?;
    let on_gpu = |x: &Tensor| -> Result<Tensor> { Ok(x.to_dtype(dtype)?.to_device(gpu)?) };
    let (out, d_qkv) = fused(&on_gpu(&qkv)?, Some(&on_gpu(&d_out)?), heads(h, t), 11)?;
    let d_qkv = d_qkv.context("gradient")?;
    let expected = reference(&qkv, &d_out, keep, h)?;
    let got = [
        split_heads(&out, h, t)?,
        split_heads(&d_qkv.narrow(2, 0, h * t)?, h, t)?,
        split_heads(&d_qkv.narrow(2, h * t, h * t)?, h, t)?,
        split_heads(&d_qkv.narrow(2, 2 * h * t, h * t)?, h, t)?,
    ];
    let variant = variant();
    let name = format!("{dtype:?} attention dropout (cuDNN{variant}), random data, read-out mask");
    for (i, part) in ["output", "dq", "dk", "dv"].iter().enumerate() {
        let tolerance = if i == 0 { 4.0 } else { 8.0 } * unit(dtype);
        let error = relative_error(&expected[i], &got[i])?;
        rows.push(check(format!("{name}: {part}"), error, tolerance));
    }
    Ok(())
}

/// Adds the rows of the read-out mask, the exact comparison and the statistics to `checks`.
pub(super) fn run(gpu: &Device, checks: &mut Vec<Check>) -> Result<()> {
    ops::set_dropout_step(gpu, 0)?;
    for dtype in [DType::BF16, DType::F16] {
        let keep = readout_rows(gpu, dtype, checks)?;
        exact_rows(gpu, dtype, &keep, checks)?;
    }
    // cuDNN's deterministic backward (`--deterministic`) must draw the forward's mask too.
    let was = ops::deterministic();
    ops::set_deterministic(true);
    let deterministic = readout_rows(gpu, DType::BF16, checks)
        .and_then(|keep| exact_rows(gpu, DType::BF16, &keep, checks));
    ops::set_deterministic(was);
    deterministic?;
    super::attention_dropout_stats::run(gpu, checks)?;
    let fallbacks: Vec<String> = ops::fused_attention_plans()
        .into_iter()
        .filter(|line| line.starts_with("no cuDNN") && line.contains("dropout: Some"))
        .collect();
    for line in &fallbacks {
        println!("gpu-check: {line}");
    }
    checks.push(check(
        "attention dropout: every configuration above ran on cuDNN (fallbacks)".into(),
        fallbacks.len() as f64,
        0.0,
    ));
    Ok(())
}
