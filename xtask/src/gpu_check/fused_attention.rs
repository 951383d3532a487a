//! cuDNN's fused causal attention (`ops::packed_causal_attention` on 16-bit GPU data) against
//! the CPU, which runs the same packed op on the same rounded inputs widened to f32 (its f64
//! kernels inside): the output, the log-sum-exp and the gradients of q, k and v, for GPT-2's,
//! Phi-3's and Llama 3's head widths (64, 96, 128) and 80, grouped-query heads, and sequence
//! lengths that are not multiples of cuDNN's tiles. Then a row that fails unless every one of
//! these geometries ran on cuDNN (not on weft's fallback).
//!
//! Tolerances, relative to each tensor's largest value: the output 4 units of the type's
//! rounding step (the weights P are rounded to the data type before `P V`, as every flash
//! attention does, then the output once); the gradients 8 units (P, and `dS = P (dP − Σ dO·O)`,
//! are rounded before the `Pᵀ dO`, `dSᵀ Q` and `dS K` products: two roundings in each chain);
//! the log-sum-exp, kept in f32, 1e-5 relative.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_tensor::ops::{self, PackedHeads};

use super::single_ops::relative_error;
use super::Check;

/// (batch, seq, heads, kv heads, head dim).
const CASES: [(usize, usize, usize, usize, usize); 5] = [
    (2, 300, 12, 12, 64),
    (1, 100, 8, 8, 80),
    (1, 257, 8, 2, 96),
    (1, 1000, 4, 1, 128),
    (1, 2048, 2, 2, 64),
];

/// The rows for one case in `dtype`: output, log-sum-exp, dq, dk, dv.
fn compare(
    gpu: &Device,
    dtype: DType,
    case: (usize, usize, usize, usize, usize),
) -> Result<Vec<(String, f64, f64)>> {
    let (b, t, h, kv, d) = case;
    let heads = PackedHeads {
        heads: h,
        kv_heads: kv,
        head_dim: d,
    };
    let round = |t: Tensor| -> Result<Tensor> { Ok(t.to_dtype(dtype)?.to_dtype(DType::F32)?) };
    let qkv = round(Tensor::randn(
        0f32,
        1.0,
        (b, t, heads.row_width()),
        &Device::Cpu,
    )?)?;
    let d_out = round(Tensor::randn(
        0f32,
        1.0,
        (b, t, heads.out_width()),
        &Device::Cpu,
    )?)?;

    let (out, lse) = ops::packed_causal_attention(&qkv, heads)?;
    let d_qkv = ops::packed_causal_attention_backward(&qkv, &out, &lse, &d_out, heads)?;

    let on_gpu = |x: &Tensor| -> Result<Tensor> { Ok(x.to_dtype(dtype)?.to_device(gpu)?) };
    let (g_qkv, g_d_out) = (on_gpu(&qkv)?, on_gpu(&d_out)?);
    let (g_out, g_lse) = ops::packed_causal_attention(&g_qkv, heads)?;
    let g_d_qkv = ops::packed_causal_attention_backward(&g_qkv, &g_out, &g_lse, &g_d_out, heads)?;
    let back =
        |x: &Tensor| -> Result<Tensor> { Ok(x.to_dtype(DType::F32)?.to_device(&Device::Cpu)?) };

    let unit = match dtype {
        DType::BF16 => 2f64.powi(-8),
        _ => 2f64.powi(-11),
    };
    let name = format!("{dtype:?} fused attention (cuDNN) b{b} T{t} heads {h}/{kv} d{d}");
    let mut rows = vec![
        (
            format!("{name}: output"),
            relative_error(&out, &back(&g_out)?)?,
            4.0 * unit,
        ),
        (
            format!("{name}: log-sum-exp"),
            relative_error(&lse, &back(&g_lse)?)?,
            1e-5,
        ),
    ];
    let g_d_qkv = back(&g_d_qkv)?;
    for (part, (at, width)) in ["dq", "dk", "dv"].iter().zip([
        (heads.offsets()[0], h * d),
        (heads.offsets()[1], kv * d),
        (heads.offsets()[2], kv * d),
    ]) {
        let error = relative_error(&d_qkv.narrow(2, at, width)?, &g_d_qkv.narrow(2, at, width)?)?;
        rows.push((format!("{name}: {part}"), error, 8.0 * unit));
    }
    Ok(rows)
}

/// Adds the fused attention's rows to `checks`.
pub(super) fn run(gpu: &Device, checks: &mut Vec<Check>) -> Result<()> {
    for dtype in [DType::BF16, DType::F16] {
        for case in CASES {
            for (name, error, tolerance) in compare(gpu, dtype, case)? {
                checks.push(Check {
                    name,
                    error,
                    tolerance,
                });
            }
        }
    }
    let fallbacks: Vec<String> = ops::fused_attention_plans()
        .into_iter()
        .filter(|line| line.starts_with("no cuDNN"))
        .collect();
    for line in &fallbacks {
        println!("gpu-check: {line}");
    }
    checks.push(Check {
        name: "fused attention: every geometry above ran on cuDNN (count of fallbacks)".into(),
        error: fallbacks.len() as f64,
        tolerance: 0.0,
    });
    Ok(())
}
