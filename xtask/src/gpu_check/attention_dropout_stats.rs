//! The statistics rows of the fused attention's dropout ([`super::attention_dropout`] says
//! what each checks and why its bound holds): the mean of many dropped outputs against the
//! output without dropout, and outputs under the same and other seeds and step values. GPT-2's
//! head width (64), 2 × 4 heads of 256 tokens, bf16.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_tensor::ops;

use super::attention_dropout::{check, equal_share, fused, heads, split_heads, weights, P};
use super::Check;

const SHAPE: (usize, usize, usize, usize) = (2, 256, 4, 64);
/// Outputs averaged.
const MASKS: usize = 64;

/// `softmax(q kᵀ / sqrt(d) + causal mask)` and the output without dropout, in f64.
fn exact(qkv: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let (_, _, h, d) = SHAPE;
    let part = |i: usize| split_heads(&qkv.narrow(2, i * h * d, h * d)?, h, d);
    let (q, k, v) = (part(0)?, part(1)?, part(2)?);
    let p = weights(&q, &k)?;
    let out = p.matmul(&v)?;
    Ok((p, v, out))
}

/// Adds the statistics rows to `checks`.
pub(super) fn run(gpu: &Device, checks: &mut Vec<Check>) -> Result<()> {
    let (b, t, h, d) = SHAPE;
    let dtype = DType::BF16;
    let qkv = Tensor::randn(0f32, 1.0, (b, t, 3 * h * d), &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(gpu)?;
    let packed = heads(h, d);
    let (p, v, exact_out) = exact(&qkv)?;

    // The mean over MASKS seeds against the exact output, in units of its standard deviation.
    let mut sum = Tensor::zeros((b, h, t, d), DType::F64, &Device::Cpu)?;
    for seed in 0..MASKS as u64 {
        let (out, _) = fused(&qkv, None, packed, 1000 + seed)?;
        sum = (sum + split_heads(&out, h, d)?)?;
    }
    let mean = (sum / MASKS as f64)?;
    let variance = ((p.sqr()?.matmul(&v.sqr()?)? * (P / (1.0 - P)))? / MASKS as f64)?;
    let z2 = ((mean - &exact_out)?.sqr()? / variance)?;
    let z2 = z2.mean_all()?.to_scalar::<f64>()?;
    let name = format!("BF16 attention dropout (cuDNN) p {P}, b{b} T{t} heads {h} d{d}");
    checks.push(check(
        format!("{name}: mean of {MASKS} masks vs no dropout, |mean z² − 1|"),
        (z2 - 1.0).abs(),
        0.2,
    ));

    // The same seed and step value: the same bits; another step value or seed: other masks.
    let seed = 7;
    ops::set_dropout_step(gpu, 1)?;
    let first = fused(&qkv, None, packed, seed)?.0;
    let again = fused(&qkv, None, packed, seed)?.0;
    ops::set_dropout_step(gpu, 2)?;
    let next_step = fused(&qkv, None, packed, seed)?.0;
    ops::set_dropout_step(gpu, 1)?;
    let other_seed = fused(&qkv, None, packed, seed + 1)?.0;
    let back = fused(&qkv, None, packed, seed)?.0;
    ops::set_dropout_step(gpu, 0)?;
    checks.push(check(
        format!("{name}: same seed and step twice, share of elements differing"),
        1.0 - equal_share(&first, &again)?,
        0.0,
    ));
    checks.push(check(
        format!("{name}: step value written again, share of elements differing"),
        1.0 - equal_share(&first, &back)?,
        0.0,
    ));
    checks.push(check(
        format!("{name}: another step value, share of elements equal"),
        equal_share(&first, &next_step)?,
        0.2,
    ));
    checks.push(check(
        format!("{name}: another seed, share of elements equal"),
        equal_share(&first, &other_seed)?,
        0.2,
    ));
    Ok(())
}
