//! The packed attention on the CPU in f64: against split heads under Candle's autograd, its
//! reference path against the fused kernels, grouped-query heads against repeated ones, and
//! the backward against finite differences.

use candle_core::{Device, Tensor, Var, D};

use super::*;

fn values(shape: (usize, usize, usize), seed: u64) -> Tensor {
    let n = shape.0 * shape.1 * shape.2;
    let v: Vec<f64> = (0..n)
        .map(|i| ((i as u64 * 7919 + seed * 104_729) % 1000) as f64 / 250.0 - 2.0)
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

const MHA: PackedHeads = PackedHeads {
    heads: 2,
    kv_heads: 2,
    head_dim: 4,
};

const GQA: PackedHeads = PackedHeads {
    heads: 4,
    kv_heads: 2,
    head_dim: 4,
};

/// The packed op equals split heads through `causal_attention` and Candle's autograd (the
/// same f64 kernels; the gradients' layout by hand): within 1e-12.
#[test]
fn packed_equals_split_heads_under_autograd() -> Result<()> {
    let (b, t) = (2, 7);
    let qkv = Var::from_tensor(&values((b, t, MHA.row_width()), 1))?;
    let upstream = values((b, t, MHA.out_width()), 2);
    let [q, k, v] = split(qkv.as_tensor(), MHA)?;
    let reference = merge(&super::super::causal_attention(&q, &k, &v)?)?;
    let grads = (&reference * &upstream)?.sum_all()?.backward()?;
    let (out, lse) = packed_causal_attention(qkv.as_tensor(), MHA)?;
    assert!(max_diff(&out, &reference) < 1e-12);
    assert_eq!(lse.dims(), [b, MHA.heads, t]);
    let d_qkv = packed_causal_attention_backward(qkv.as_tensor(), &out, &lse, &upstream, MHA)?;
    let expected = grads.get(qkv.as_tensor()).expect("a gradient");
    assert!(
        max_diff(&d_qkv, expected) < 1e-12,
        "{}",
        max_diff(&d_qkv, expected)
    );
    Ok(())
}

/// The reference path (Candle's ops over the full scores) computes what the fused kernels do:
/// output, log-sum-exp and the three gradients within 1e-12.
#[test]
fn reference_path_equals_the_fused_kernels() -> Result<()> {
    let qkv = values((2, 9, MHA.row_width()), 3);
    let [q, k, v] = split(&qkv, MHA)?;
    let (out, packed) = causal_attention_saving(&q, &k, &v)?.expect("CPU kernels");
    let lse = packed.narrow(3, MHA.head_dim, 1)?.squeeze(3)?;
    let (ref_out, ref_lse) = reference_forward(&q, &k, &v)?;
    assert!(max_diff(&out, &ref_out) < 1e-12);
    assert!(max_diff(&lse, &ref_lse) < 1e-12);
    let d_o = heads_of(&values((2, 9, MHA.out_width()), 4), MHA.heads, MHA.head_dim)?;
    let fused = causal_attention_backward(&q, &k, &v, &packed, &d_o)?;
    let reference = reference_backward(&q, &k, &v, &out, &lse, &d_o)?;
    for (a, b) in [
        (fused.0, reference.0),
        (fused.1, reference.1),
        (fused.2, reference.2),
    ] {
        assert!(max_diff(&a, &b) < 1e-12, "{}", max_diff(&a, &b));
    }
    Ok(())
}

/// Grouped-query heads equal multi-head attention with each key/value head repeated for its
/// group (HF's `repeat_kv`), and their gradients are the repeated heads' gradients summed.
#[test]
fn grouped_query_heads_read_their_groups_key_value_head() -> Result<()> {
    let (b, t) = (1, 6);
    let qkv = values((b, t, GQA.row_width()), 5);
    let [q, k, v] = split(&qkv, GQA)?;
    let full = PackedHeads { kv_heads: 4, ..GQA };
    let repeated = Tensor::cat(
        &[
            merge(&q)?,
            merge(&repeat_kv(&k, GQA)?)?,
            merge(&repeat_kv(&v, GQA)?)?,
        ],
        D::Minus1,
    )?;
    let (out, lse) = packed_causal_attention(&qkv, GQA)?;
    let (full_out, full_lse) = packed_causal_attention(&repeated, full)?;
    assert!(max_diff(&out, &full_out) < 1e-12);
    assert!(max_diff(&lse, &full_lse) < 1e-12);
    let d_out = values((b, t, GQA.out_width()), 6);
    let d_qkv = packed_causal_attention_backward(&qkv, &out, &lse, &d_out, GQA)?;
    let d_full = packed_causal_attention_backward(&repeated, &full_out, &full_lse, &d_out, full)?;
    let [dq, dk, dv] = split(&d_qkv, GQA)?;
    let [fq, fk, fv] = split(&d_full, full)?;
    assert!(max_diff(&dq, &fq) < 1e-12);
    assert!(max_diff(&dk, &sum_groups(&fk, GQA)?) < 1e-12);
    assert!(max_diff(&dv, &sum_groups(&fv, GQA)?) < 1e-12);
    Ok(())
}

/// `Σ out · r` differentiated by central differences (step 1e-6) against the backward, for
/// grouped-query heads: agreement within 1e-7 (the differences' truncation error, about
/// step² times the third derivative, is far below it; rounding about 1e-16 / step).
#[test]
fn backward_matches_finite_differences() -> Result<()> {
    let heads = PackedHeads {
        heads: 2,
        kv_heads: 1,
        head_dim: 2,
    };
    let (b, t) = (1, 3);
    let qkv = values((b, t, heads.row_width()), 7);
    let r = values((b, t, heads.out_width()), 8);
    let loss = |x: &Tensor| -> f64 {
        let (out, _) = packed_causal_attention(x, heads).unwrap();
        (out * &r).unwrap().sum_all().unwrap().to_scalar().unwrap()
    };
    let (out, lse) = packed_causal_attention(&qkv, heads)?;
    let analytic = packed_causal_attention_backward(&qkv, &out, &lse, &r, heads)?
        .flatten_all()?
        .to_vec1::<f64>()?;
    let base = qkv.flatten_all()?.to_vec1::<f64>()?;
    let step = 1e-6;
    for (i, expected) in analytic.iter().enumerate() {
        let at = |delta: f64| {
            let mut moved = base.clone();
            moved[i] += delta;
            Tensor::from_vec(moved, qkv.dims(), &Device::Cpu).unwrap()
        };
        let numeric = (loss(&at(step)) - loss(&at(-step))) / (2.0 * step);
        assert!(
            (numeric - expected).abs() < 1e-7,
            "{i}: {numeric} vs {expected}"
        );
    }
    Ok(())
}

/// Rows whose width does not fit the heads are refused in one line naming both.
#[test]
fn a_width_that_does_not_fit_the_heads_is_refused() {
    let qkv = values((1, 3, 20), 9);
    let error = packed_causal_attention(&qkv, MHA).unwrap_err().to_string();
    let first = error.lines().next().unwrap_or_default();
    assert!(
        first.contains("rows of 20") && first.contains("2 query"),
        "{error}"
    );
}
