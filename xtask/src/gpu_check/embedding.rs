//! `embed_tokens` and its backward on the GPU against the CPU, at GPT-2's width (768 columns:
//! the kernels' 16-byte vectors): 4 sequences of 100 tokens over a table of 1000 rows and 128
//! positions (the 28 past the sequences get zero gradients), ids (i² mod 97): few of the rows,
//! most of them repeated. f32 against the CPU's f64 sums rounded once (1e-6 relative to the
//! largest value); bf16 and f16 against the CPU computing in f32 on the same rounded values and
//! rounding once (four units of the type's rounding step: 4 · 2^-8 and 4 · 2^-11). One row has
//! every token take the same id (400 gradient rows summed into one, in token order on both
//! sides); one checks that an id past the table, which the GPU does not check (that would
//! read the device every step), gives a NaN output row and adds nothing to the gradient.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_tensor::ops;

use super::single_ops::relative_error;
use super::Check;

const BATCH: usize = 4;
const SEQ: usize = 100;
const VOCAB: usize = 1000;
const POSITIONS: usize = 128;
const COLS: usize = 768;

/// The table, the positions and an output gradient, drawn in f32 and rounded to `dtype`.
fn inputs(dtype: DType) -> Result<[Tensor; 3]> {
    let draw = |shape: &[usize]| -> Result<Tensor> {
        Ok(Tensor::randn(0f32, 1.0, shape, &Device::Cpu)?.to_dtype(dtype)?)
    };
    Ok([
        draw(&[VOCAB, COLS])?,
        draw(&[POSITIONS, COLS])?,
        draw(&[BATCH, SEQ, COLS])?,
    ])
}

/// The output, the table's gradient and the positions' on `device`, back on the CPU.
fn embed_and_back(
    device: &Device,
    [table, positions, dy]: &[Tensor; 3],
    ids: &[u32],
) -> Result<[Tensor; 3]> {
    let on = |t: &Tensor| t.to_device(device);
    let ids = Tensor::from_vec(ids.to_vec(), (BATCH, SEQ), device)?;
    let out = ops::embed_tokens(&on(table)?, &on(positions)?, &ids)?;
    let (d_table, d_positions) = ops::embed_tokens_backward(&ids, &on(dy)?, VOCAB, POSITIONS)?;
    let back = |t: Tensor| t.to_device(&Device::Cpu);
    Ok([back(out)?, back(d_table)?, back(d_positions)?])
}

/// The largest relative errors of the GPU's forward output and of its two gradients against
/// the CPU's, for `ids`; infinite where a GPU result is not of `dtype`.
fn compare(gpu: &Device, dtype: DType, ids: &[u32]) -> Result<(f64, f64)> {
    let t = inputs(dtype)?;
    let cpu = embed_and_back(&Device::Cpu, &t, ids)?;
    let on_gpu = embed_and_back(gpu, &t, ids)?;
    if on_gpu.iter().any(|t| t.dtype() != dtype) {
        return Ok((f64::INFINITY, f64::INFINITY));
    }
    let forward = relative_error(&cpu[0], &on_gpu[0])?;
    let backward = relative_error(&cpu[1], &on_gpu[1])?.max(relative_error(&cpu[2], &on_gpu[2])?);
    Ok((forward, backward))
}

/// Token 7 given an id past the table, in f32 on the GPU: 0 when its output row is NaN, every
/// other row is the one it has with a valid id there, and the gradients are those with that
/// token's gradient row zeroed; otherwise the largest relative error (infinite for a row that
/// is not NaN).
fn past_the_table(gpu: &Device, ids: &[u32]) -> Result<f64> {
    let bad_token = 7;
    let t = inputs(DType::F32)?;
    let mut bad = ids.to_vec();
    bad[bad_token] = VOCAB as u32 + 5;
    let [out, d_table, d_positions] = embed_and_back(gpu, &t, &bad)?;
    let mut dropped = t[2].flatten_all()?.to_vec1::<f32>()?;
    dropped[bad_token * COLS..(bad_token + 1) * COLS].fill(0.0);
    let dropped = Tensor::from_vec(dropped, (BATCH, SEQ, COLS), &Device::Cpu)?;
    let mut good = ids.to_vec();
    good[bad_token] = 0;
    let [out_ok, d_table_ok, _] =
        embed_and_back(gpu, &[t[0].clone(), t[1].clone(), dropped], &good)?;
    let rows = |t: &Tensor| t.reshape((BATCH * SEQ, COLS));
    let row: Vec<f32> = rows(&out)?.get(bad_token)?.to_vec1()?;
    if !row.iter().all(|v| v.is_nan()) {
        return Ok(f64::INFINITY);
    }
    let others = |t: &Tensor| -> Result<Tensor> {
        let r = rows(t)?;
        Ok(Tensor::cat(
            &[
                r.narrow(0, 0, bad_token)?,
                r.narrow(0, bad_token + 1, BATCH * SEQ - bad_token - 1)?,
            ],
            0,
        )?)
    };
    let [_, _, d_positions_ok] = embed_and_back(gpu, &t, &good)?;
    Ok(relative_error(&others(&out_ok)?, &others(&out)?)?
        .max(relative_error(&d_table_ok, &d_table)?)
        .max(relative_error(&d_positions_ok, &d_positions)?))
}

/// Adds the embedding rows to `checks`.
pub(super) fn run(gpu: &Device, checks: &mut Vec<Check>) -> Result<()> {
    let repeated: Vec<u32> = (0..BATCH * SEQ).map(|i| ((i * i) % 97) as u32).collect();
    let shape = format!("{BATCH} x {SEQ} of {VOCAB} x {COLS}, ids (i² mod 97)");
    for (dtype, tolerance) in [
        (DType::F32, 1e-6),
        (DType::BF16, 4.0 * 2f64.powi(-8)),
        (DType::F16, 4.0 * 2f64.powi(-11)),
    ] {
        let (forward, backward) = compare(gpu, dtype, &repeated)?;
        checks.push(Check {
            name: format!("{dtype:?} embed_tokens {shape}"),
            error: forward,
            tolerance,
        });
        checks.push(Check {
            name: format!("{dtype:?} embed_tokens_backward {shape}"),
            error: backward,
            tolerance,
        });
    }
    let same = vec![523u32; BATCH * SEQ];
    let (forward, backward) = compare(gpu, DType::BF16, &same)?;
    checks.push(Check {
        name: "BF16 embed_tokens and backward, every id 523".into(),
        error: forward.max(backward),
        tolerance: 4.0 * 2f64.powi(-8),
    });
    checks.push(Check {
        name: "F32 embed_tokens, an id past the table: NaN row, no gradient".into(),
        error: past_the_table(gpu, &repeated)?,
        tolerance: 0.0,
    });
    Ok(())
}
