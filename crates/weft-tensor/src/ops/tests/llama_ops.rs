//! The Llama family's ops (RMSNorm, SwiGLU, the rotary embedding of a packed projection, the
//! packed attention as an autograd op) in f64: the fused ops against Candle's composed
//! references (outputs and autograd gradients within 1e-12: the same math in another order),
//! their gradients against central differences, their graph-free backward passes against
//! autograd, and RMSNorm's 16-bit rows computed in f32.

use candle_core::{DType, Device, Result, Tensor};

use super::super::{
    causal_attention_reference, packed_attention, rms_norm, rms_norm_backward, rms_norm_reference,
    rotary_packed, rotary_packed_backward, rotary_packed_reference, swiglu, swiglu_backward,
    swiglu_reference, PackedHeads,
};
use super::support::{assert_close, autograd, finite_differences, seeded, values, TensorFn};

/// `fused` and `reference` agree within 1e-12 in output and every input's gradient, and
/// `fused`'s gradients match central differences within `fd` (relative to max(|g|, 1)).
fn check(fused: TensorFn<'_>, reference: TensorFn<'_>, inputs: &[Tensor], fd: f64, what: &str) {
    let (a, b) = (fused(inputs).unwrap(), reference(inputs).unwrap());
    assert_close(&values(&a), &values(&b), 1e-12, &format!("{what}: output"));
    let (ga, gb) = (
        autograd(fused, inputs).unwrap(),
        autograd(reference, inputs).unwrap(),
    );
    for (i, (ga, gb)) in ga.iter().zip(&gb).enumerate() {
        assert_close(
            ga,
            gb,
            1e-12,
            &format!("{what}: gradient {i} against the reference"),
        );
        let numeric = finite_differences(fused, inputs, i).unwrap();
        assert_close(
            ga,
            &numeric,
            fd,
            &format!("{what}: gradient {i} against differences"),
        );
    }
}

fn heads() -> PackedHeads {
    PackedHeads {
        heads: 4,
        kv_heads: 2,
        head_dim: 6,
    }
}

fn inverse() -> Tensor {
    Tensor::new(&[1.0f32, 0.1, 0.01], &Device::Cpu).unwrap()
}

#[test]
fn rms_norm_equals_its_reference_and_finite_differences() {
    let fused = |t: &[Tensor]| rms_norm(&t[0], &t[1], 1e-5);
    let reference = |t: &[Tensor]| rms_norm_reference(&t[0], &t[1], 1e-5);
    let inputs = [seeded(&[2, 3, 10], 1), seeded(&[10], 2)];
    check(&fused, &reference, &inputs, 1e-7, "rms_norm");
    // The graph-free backward is the op's own.
    let dy = seeded(&[2, 3, 10], 3);
    let (dx, dw) = rms_norm_backward(&inputs[0], &inputs[1], &dy, 1e-5).unwrap();
    let through = |t: &[Tensor]| (rms_norm(&t[0], &t[1], 1e-5)? * &dy)?.sum_all();
    let x = candle_core::Var::from_tensor(&inputs[0]).unwrap();
    let w = candle_core::Var::from_tensor(&inputs[1]).unwrap();
    let grads = through(&[x.as_tensor().clone(), w.as_tensor().clone()])
        .unwrap()
        .backward()
        .unwrap();
    assert_close(&values(&dx), &values(grads.get(&x).unwrap()), 1e-12, "dx");
    assert_close(&values(&dw), &values(grads.get(&w).unwrap()), 1e-12, "dw");
}

/// bf16 on the CPU computes in f32 and rounds once: within a bf16 step of the f64 result.
#[test]
fn sixteen_bit_rms_norm_computes_in_f32() -> Result<()> {
    let (x, w) = (seeded(&[4, 10], 3), seeded(&[10], 5));
    let exact = rms_norm(&x, &w, 1e-6)?;
    let narrow = rms_norm(&x.to_dtype(DType::BF16)?, &w.to_dtype(DType::BF16)?, 1e-6)?;
    assert_eq!(narrow.dtype(), DType::BF16);
    let largest = values(&exact).iter().fold(0f64, |m, v| m.max(v.abs()));
    let wide = values(&narrow);
    for (a, e) in wide.iter().zip(values(&exact)) {
        assert!((a - e).abs() <= largest / 128.0, "{a} against {e}");
    }
    Ok(())
}

#[test]
fn swiglu_equals_its_reference_and_finite_differences() {
    let fused = |t: &[Tensor]| swiglu(&t[0], &t[1]);
    let reference = |t: &[Tensor]| swiglu_reference(&t[0], &t[1]);
    let inputs = [(seeded(&[4, 6], 1) * 3.0).unwrap(), seeded(&[4, 6], 2)];
    check(&fused, &reference, &inputs, 1e-8, "swiglu");
    // The graph-free backward's composed path (CUDA f64 takes it) equals the fused one.
    let dy = seeded(&[4, 6], 3);
    let fused = swiglu_backward(&inputs[0], &inputs[1], &dy).unwrap();
    let composed =
        super::super::swiglu::swiglu_backward_reference(&inputs[0], &inputs[1], &dy).unwrap();
    assert_close(&values(&fused.0), &values(&composed.0), 1e-14, "d_gate");
    assert_close(&values(&fused.1), &values(&composed.1), 1e-14, "d_up");
}

#[test]
fn rotary_equals_its_reference_and_finite_differences() {
    let fused = |t: &[Tensor]| rotary_packed(&t[0], heads(), &inverse());
    let reference = |t: &[Tensor]| rotary_packed_reference(&t[0], heads(), &inverse());
    let inputs = [seeded(&[2, 5, heads().row_width()], 4)];
    check(&fused, &reference, &inputs, 1e-8, "rotary_packed");
    let out = fused(&inputs).unwrap();
    // The values pass unchanged; position 0 is not rotated.
    let (q_and_k, v) = (36, 12);
    assert_eq!(
        values(&out.narrow(2, q_and_k, v).unwrap()),
        values(&inputs[0].narrow(2, q_and_k, v).unwrap())
    );
    let first = |t: &Tensor| values(&t.narrow(1, 0, 1).unwrap());
    assert_close(&first(&out), &first(&inputs[0]), 1e-15, "position 0");
    // The graph-free backward is the inverse rotation.
    let dy = seeded(&[2, 5, heads().row_width()], 5);
    let through = |t: &[Tensor]| (fused(t)? * &dy)?.sum_all();
    let grads = autograd_of(&through, &inputs[0]);
    let graph_free = rotary_packed_backward(&dy, heads(), &inverse()).unwrap();
    assert_close(
        &values(&graph_free),
        &grads,
        1e-12,
        "rotary_packed_backward",
    );
}

/// The gradient of the scalar `f(x)` at `x`.
fn autograd_of(f: TensorFn<'_>, x: &Tensor) -> Vec<f64> {
    let var = candle_core::Var::from_tensor(x).unwrap();
    let grads = f(&[var.as_tensor().clone()]).unwrap().backward().unwrap();
    values(grads.get(&var).unwrap())
}

#[test]
fn packed_attention_equals_the_composed_reference() {
    let heads = PackedHeads {
        heads: 4,
        kv_heads: 2,
        head_dim: 4,
    };
    let fused = |t: &[Tensor]| packed_attention(&t[0], heads);
    let reference = |t: &[Tensor]| grouped_reference(&t[0], heads);
    let inputs = [seeded(&[2, 5, heads.row_width()], 6)];
    check(&fused, &reference, &inputs, 1e-7, "packed_attention");
    // Without a graph the forward's own output comes back.
    let plain = packed_attention(&inputs[0], heads).unwrap();
    assert_eq!(values(&plain), values(&fused(&inputs).unwrap()));
}

/// Attention over the full scores with the key/value heads repeated for the grouped heads.
fn grouped_reference(qkv: &Tensor, heads: PackedHeads) -> Result<Tensor> {
    let (b, t, _) = qkv.dims3()?;
    let d = heads.head_dim;
    let part = |from: usize, count: usize| -> Result<Tensor> {
        let x = qkv.narrow(2, from * d, count * d)?;
        x.reshape((b, t, count, d))?.transpose(1, 2)
    };
    let group = heads.heads / heads.kv_heads;
    let repeat = |x: Tensor| -> Result<Tensor> {
        let x = x
            .unsqueeze(2)?
            .broadcast_as((b, heads.kv_heads, group, t, d))?;
        x.reshape((b, heads.heads, t, d))?.contiguous()
    };
    let q = part(0, heads.heads)?.contiguous()?;
    let k = repeat(part(heads.heads, heads.kv_heads)?)?;
    let v = repeat(part(heads.heads + heads.kv_heads, heads.kv_heads)?)?;
    let out = causal_attention_reference(&q, &k, &v, None)?;
    out.transpose(1, 2)?.reshape((b, t, heads.heads * d))
}
