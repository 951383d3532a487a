//! The Llama family's ops on the GPU against the CPU, through autograd (outputs and the
//! gradients of every input): RMSNorm (the 16-bit LayerNorm kernels without mean and bias, at
//! Llama 3.2 1B's width, a width not a multiple of 8, and a misaligned input), SwiGLU, the
//! rotary embedding of a packed projection (grouped-query heads of 64, positions to 300) and
//! the packed attention as an autograd op (cuDNN on 16-bit data), in bf16 and f16; SwiGLU and
//! the rotation in f32 too; and a tiny Llama's logits and gradients in f32.
//!
//! Tolerances, relative to each tensor's largest value: 16-bit rows 4 units of the type's
//! rounding step (both sides compute in f32 and round each output once; the gradients pass the
//! output's weighting through one rounding), the attention 8 units (as the fused attention's
//! rows: P and dS rounded inside cuDNN); f32 rows 1e-5 (f32 against the CPU's f64 inside; the
//! rotation's angles are f32 on both sides).

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_models::llama::{llama, LlamaConfig};
use weft_tensor::ops::{self, PackedHeads};
use weft_tensor::Mode;

use super::half::{rounded_from_f32, Op};
use super::single_ops::{compare_op, relative_error};
use super::Check;

const HEADS: PackedHeads = PackedHeads {
    heads: 8,
    kv_heads: 2,
    head_dim: 64,
};

/// Llama 3's inverse frequencies for head width 64 (base 500000), on `device`.
fn inverse(device: &Device) -> candle_core::Result<Tensor> {
    let values: Vec<f32> = (0..32)
        .map(|i| 500_000f64.powf(-(2 * i) as f64 / 64.0) as f32)
        .collect();
    Tensor::from_vec(values, 32, device)
}

/// Adds the Llama's rows to `checks`.
pub(super) fn run(gpu: &Device, checks: &mut Vec<Check>) -> Result<()> {
    let rms = |t: &[Tensor]| ops::rms_norm(&t[0], &t[1], 1e-5);
    let rms_misaligned = |t: &[Tensor]| {
        let flat = t[0].flatten_all()?;
        let shifted = Tensor::cat(&[&flat.narrow(0, 0, 1)?, &flat], 0)?;
        let x = shifted
            .narrow(0, 1, t[0].elem_count())?
            .reshape(t[0].shape())?;
        ops::rms_norm(&x, &t[1], 1e-5)
    };
    let swiglu = |t: &[Tensor]| ops::swiglu(&t[0], &t[1]);
    let rotary = |t: &[Tensor]| ops::rotary_packed(&t[0], HEADS, &inverse(t[0].device())?);
    let attention = |t: &[Tensor]| ops::packed_attention(&t[0], HEADS);
    let width = HEADS.row_width();
    let cases: [(&str, &[&[usize]], Op<'_>, f64); 7] = [
        ("rms_norm 64 x 2048", &[&[64, 2048], &[2048]], &rms, 4.0),
        ("rms_norm 50 x 100", &[&[50, 100], &[100]], &rms, 4.0),
        (
            "rms_norm 2 x 16 x 576, misaligned",
            &[&[2, 16, 576], &[576]],
            &rms_misaligned,
            4.0,
        ),
        ("swiglu 63 x 301", &[&[63, 301], &[63, 301]], &swiglu, 4.0),
        (
            "rotary_packed 2 x 300 x 8/2 heads of 64",
            &[&[2, 300, width]],
            &rotary,
            4.0,
        ),
        (
            "rotary_packed 1 x 7 x 8/2 heads of 64",
            &[&[1, 7, width]],
            &rotary,
            4.0,
        ),
        (
            "packed_attention 1 x 257 x 8/2 heads of 64",
            &[&[1, 257, width]],
            &attention,
            8.0,
        ),
    ];
    for (dtype, unit) in [(DType::BF16, 2f64.powi(-8)), (DType::F16, 2f64.powi(-11))] {
        for (name, shapes, f, units) in cases {
            checks.push(Check {
                name: format!("{dtype:?} llama {name}"),
                error: compare_op(gpu, shapes, rounded_from_f32(dtype, f))?,
                tolerance: units * unit,
            });
        }
    }
    for (name, shapes, f) in [
        (
            "swiglu 63 x 301",
            &[&[63, 301][..], &[63, 301]][..],
            &swiglu as Op<'_>,
        ),
        (
            "rotary_packed 2 x 300 x 8/2 heads of 64",
            &[&[2, 300, width]],
            &rotary,
        ),
    ] {
        checks.push(Check {
            name: format!("F32 llama {name}"),
            error: compare_op(gpu, shapes, f)?,
            tolerance: 1e-5,
        });
    }
    checks.push(Check {
        name: "F32 llama-tiny logits".into(),
        error: tiny_logits(gpu)?,
        tolerance: 1e-5,
    });
    Ok(())
}

/// The largest relative difference of a tiny Llama's logits, on the GPU and on the CPU.
fn tiny_logits(gpu: &Device) -> Result<f64> {
    let config = LlamaConfig::from_name("llama-tiny")?.with_seed(3);
    let ids: Vec<u32> = (0..2 * 40).map(|i| (i * 37 % 256) as u32).collect();
    let logits = |device: &Device| -> Result<Tensor> {
        let model = llama(&config, DType::F32, device)?;
        let ids = Tensor::from_vec(ids.clone(), (2, 40), device)?;
        Ok(model.forward(&ids, Mode::EVAL)?.to_device(&Device::Cpu)?)
    };
    relative_error(&logits(&Device::Cpu)?, &logits(gpu)?)
}
