//! Grouped-query causal attention with rotary position embeddings, over `[B, heads, T, d]`
//! queries and `[B, kv heads, T, d]` keys and values: the rotation of [`super::rope`] applied
//! to queries and keys (`x cos + rotate_half(x) sin`), each key/value head repeated for the
//! query heads that read it (Hugging Face's `repeat_kv`: query head h reads key/value head
//! h ÷ (heads ÷ kv heads)), then weft-tensor's fused causal attention. This is the naive form
//! the tests hold the model's packed path (`ops::rotary_packed`, `ops::packed_attention`)
//! against.

use candle_core::{Tensor, D};
use weft_tensor::{ops, Result};

/// The cosines and sines of positions `0..t` for `inverse` frequencies, `[t, 2·len]` each, in
/// `like`'s type and on its device.
pub fn rotary_tables(inverse: &[f64], t: usize, like: &Tensor) -> Result<(Tensor, Tensor)> {
    let (cos, sin) = super::rope::cos_sin(t, inverse);
    let width = 2 * inverse.len();
    let table = |v: Vec<f64>| -> Result<Tensor> {
        Ok(Tensor::from_vec(v, (t, width), like.device())?.to_dtype(like.dtype())?)
    };
    Ok((table(cos)?, table(sin)?))
}

/// `x cos + rotate_half(x) sin` for `x` `[B, heads, T, d]` and tables `[T, d]`.
pub fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let (first, second) = (
        x.narrow(D::Minus1, 0, half)?,
        x.narrow(D::Minus1, half, half)?,
    );
    let rotated = Tensor::cat(&[&second.neg()?, &first], D::Minus1)?;
    Ok((x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?)?)
}

/// Each of `x`'s `[B, kv heads, T, d]` heads repeated `group` times in a row: `[B, kv·group,
/// T, d]`.
pub fn repeat_kv(x: &Tensor, group: usize) -> Result<Tensor> {
    if group == 1 {
        return Ok(x.clone());
    }
    let (b, kv, t, d) = x.dims4()?;
    Ok(x.unsqueeze(2)?
        .broadcast_as((b, kv, group, t, d))?
        .reshape((b, kv * group, t, d))?)
}

/// `softmax(q kᵀ / sqrt(d) + causal mask) v` with `q` `[B, heads, T, d]` and `k`, `v` `[B, kv
/// heads, T, d]`, RoPE applied to `q` and `k` by `cos`, `sin` (`[T, d]`): `[B, heads, T, d]`.
pub fn grouped_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    (cos, sin): (&Tensor, &Tensor),
) -> Result<Tensor> {
    let group = q.dim(1)? / k.dim(1)?;
    let q = rotate(q, cos, sin)?.contiguous()?;
    let k = repeat_kv(&rotate(k, cos, sin)?, group)?.contiguous()?;
    let v = repeat_kv(v, group)?.contiguous()?;
    Ok(ops::causal_attention(&q, &k, &v)?)
}
