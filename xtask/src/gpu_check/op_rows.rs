//! gpu-check's rows of single operations in f32 against the CPU: every convolution shape of a
//! torchvision ResNet (and the input gradient added in place), weft's kernels (batch norm with
//! and without the fused ReLU, ReLU, add + ReLU, max-pool; the graph-free batch norm), the
//! transformer's ops (fused causal attention, cross-entropy rows, layer norm, tanh GELU), and
//! Candle's ops that CUDA tensors of other dtypes fall back to.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_tensor::ops;

use super::single_ops::{compare_conv_backward_add, compare_graph_free_batch_norm, compare_op};
use super::Check;

/// A convolution to check: name, input shape, weight shape, stride, padding.
type ConvCase = (&'static str, [usize; 4], [usize; 4], usize, usize);

/// Pushes the rows of single operations onto `checks`.
pub(super) fn rows(gpu: &Device, checks: &mut Vec<Check>) -> Result<()> {
    // (name, kernel, stride, padding): every convolution shape of a torchvision ResNet.
    let convs = [
        ("conv2d 3x3 stride 1", 3, 1, 1),
        ("conv2d 3x3 stride 2", 3, 2, 1),
        ("conv2d 1x1 stride 1", 1, 1, 0),
        ("conv2d 1x1 stride 2", 1, 2, 0),
        ("conv2d 7x7 stride 2 pad 3", 7, 2, 3),
    ];
    for (name, k, stride, pad) in convs {
        let error = compare_op(gpu, &[&[4, 8, 16, 16], &[16, 8, k, k]], |t| {
            ops::conv2d(&t[0], &t[1], stride, pad)
        })?;
        checks.push(Check {
            name: name.into(),
            error,
            tolerance: 1e-3,
        });
    }
    // ResNet-50's own sizes at 64x64 input, batch 4.
    let big_convs: [ConvCase; 3] = [
        (
            "conv2d stem 7x7/2 @64 (3->64)",
            [4, 3, 64, 64],
            [64, 3, 7, 7],
            2,
            3,
        ),
        (
            "conv2d 3x3 @16 (64->64)",
            [4, 64, 16, 16],
            [64, 64, 3, 3],
            1,
            1,
        ),
        (
            "conv2d 1x1/2 @8 (512->1024)",
            [4, 512, 8, 8],
            [1024, 512, 1, 1],
            2,
            0,
        ),
    ];
    for (name, x, w, stride, pad) in big_convs {
        let error = compare_op(gpu, &[&x, &w], |t| ops::conv2d(&t[0], &t[1], stride, pad))?;
        checks.push(Check {
            name: name.into(),
            error,
            tolerance: 1e-3,
        });
    }
    // The input gradient added in place (a residual block's two gradients meeting).
    for (name, x, w, stride_pad) in [
        (
            "conv2d_backward_add 3x3 @16",
            [4, 64, 16, 16],
            [64, 64, 3, 3],
            (1, 1),
        ),
        (
            "conv2d_backward_add 1x1/2 @8",
            [4, 256, 8, 8],
            [512, 256, 1, 1],
            (2, 0),
        ),
    ] {
        checks.push(Check {
            name: name.into(),
            error: compare_conv_backward_add(gpu, x, w, stride_pad, DType::F32)?,
            tolerance: 1e-3,
        });
    }
    // weft's kernels (kernels/*.cu): batch norm (one and several blocks per channel), with
    // and without the fused ReLU, ReLU, add + ReLU, max-pool (ties after a ReLU: the gradient
    // goes to the first maximum).
    let bn = |t: &[Tensor]| Ok(ops::batch_norm_train(&t[0], &t[1], &t[2], 1e-5)?.0);
    let bn_relu = |t: &[Tensor]| Ok(ops::batch_norm_relu_train(&t[0], &t[1], &t[2], 1e-5)?.0);
    let pool = |t: &[Tensor]| ops::max_pool2d(&t[0], 3, 2, 1);
    let pool_after_relu = |t: &[Tensor]| ops::max_pool2d(&ops::relu(&t[0])?, 3, 2, 1);
    let relu = |t: &[Tensor]| ops::relu(&t[0]);
    let add_relu = |t: &[Tensor]| ops::add_relu(&t[0], &t[1]);
    type OpCheck<'a> = (
        &'static str,
        &'a [&'a [usize]],
        f64,
        &'a dyn Fn(&[Tensor]) -> candle_core::Result<Tensor>,
    );
    let kernel_checks: [OpCheck; 10] = [
        (
            "batch_norm_train @32 (64 ch)",
            &[&[4, 64, 32, 32], &[64], &[64]],
            1e-3,
            &bn,
        ),
        (
            "batch_norm_train @6 (8 ch)",
            &[&[4, 8, 6, 6], &[8], &[8]],
            1e-3,
            &bn,
        ),
        (
            "batch_norm_train @56 (64 ch, split)",
            &[&[8, 64, 56, 56], &[64], &[64]],
            1e-3,
            &bn,
        ),
        (
            "batch_norm_relu_train @32",
            &[&[4, 64, 32, 32], &[64], &[64]],
            1e-3,
            &bn_relu,
        ),
        ("relu", &[&[4, 64, 32, 32]], 1e-6, &relu),
        (
            "add_relu",
            &[&[4, 64, 32, 32], &[4, 64, 32, 32]],
            1e-6,
            &add_relu,
        ),
        (
            "max_pool2d @32 after ReLU",
            &[&[4, 64, 32, 32]],
            1e-6,
            &pool_after_relu,
        ),
        (
            "max_pool2d after ReLU (ties)",
            &[&[4, 8, 16, 16]],
            1e-6,
            &pool_after_relu,
        ),
        ("max_pool2d 3x3/2 pad 1", &[&[4, 8, 15, 15]], 1e-6, &pool),
        (
            "max_pool2d @112 (64 ch)",
            &[&[2, 64, 112, 112]],
            1e-6,
            &pool,
        ),
    ];
    for (name, shapes, tolerance, f) in kernel_checks {
        checks.push(Check {
            name: name.into(),
            error: compare_op(gpu, shapes, f)?,
            tolerance,
        });
    }
    // The graph-free batch norm of blocks with their own backward (tables instead of copies)
    // and the in-place running-statistics update.
    for (name, dims, relu) in [
        ("graph-free batch norm @56 (split)", [8, 64, 56, 56], false),
        ("graph-free batch norm + ReLU @7", [8, 256, 7, 7], true),
    ] {
        checks.push(Check {
            name: name.into(),
            error: compare_graph_free_batch_norm(gpu, dims, (relu, false), DType::F32)?,
            tolerance: 1e-3,
        });
    }
    // The fused causal attention (the CPU computes in f64 inside): one tile, several tiles with
    // a ragged last one, GPT-2's head width over 300 tokens; and GPT-2's tanh GELU.
    for (name, shape) in [
        ("fused attention d4 T5", [2, 3, 5, 4]),
        ("fused attention d16 T70", [2, 3, 70, 16]),
        ("fused attention d64 T300", [1, 4, 300, 64]),
    ] {
        let error = compare_op(gpu, &[&shape, &shape, &shape], |t| {
            ops::causal_attention(&t[0], &t[1], &t[2])
        })?;
        checks.push(Check {
            name: name.into(),
            error,
            tolerance: 1e-4,
        });
    }
    checks.push(Check {
        name: "cross_entropy_rows 64 x 1000 (990 classes)".into(),
        error: compare_op(gpu, &[&[64, 1000]], |t| {
            let targets: Vec<u32> = (0..64).map(|i| i * 13 % 990).collect();
            let targets = Tensor::from_vec(targets, 64, t[0].device())?;
            ops::cross_entropy_rows(&t[0], &targets, 990)
        })?,
        tolerance: 1e-5,
    });
    // bf16 logits: read as they are on the GPU and their gradient written in bf16, against the
    // CPU widening them to f32 first. The same f32 arithmetic up to exp's last bits, then one
    // rounding of the gradient to bf16 on either side: a unit of bf16 (2^-8) at most.
    checks.push(Check {
        name: "cross_entropy_rows 64 x 1000 (990 classes), bf16 logits".into(),
        error: compare_op(gpu, &[&[64, 1000]], |t| {
            let targets: Vec<u32> = (0..64).map(|i| i * 13 % 990).collect();
            let targets = Tensor::from_vec(targets, 64, t[0].device())?;
            ops::cross_entropy_rows(&t[0].to_dtype(DType::BF16)?, &targets, 990)
        })?,
        tolerance: 2f64.powi(-8),
    });
    checks.push(Check {
        name: "layer_norm 64 x 768".into(),
        error: compare_op(gpu, &[&[64, 768], &[768], &[768]], |t| {
            ops::layer_norm(&t[0], &t[1], &t[2], 1e-5)
        })?,
        tolerance: 1e-5,
    });
    checks.push(Check {
        name: "gelu_tanh".into(),
        error: compare_op(gpu, &[&[64, 300]], |t| ops::gelu_tanh(&t[0]))?,
        tolerance: 1e-5,
    });
    // Candle's ops, which CUDA tensors of other dtypes take.
    ops::set_cuda_kernels(false);
    let fallback_checks: [OpCheck; 3] = [
        (
            "Candle batch_norm_train",
            &[&[4, 8, 6, 6], &[8], &[8]],
            1e-3,
            &bn,
        ),
        (
            "Candle max_pool2d 3x3/2 pad 1",
            &[&[4, 8, 15, 15]],
            1e-5,
            &pool,
        ),
        ("Candle relu", &[&[4, 8, 15, 15]], 1e-6, &relu),
    ];
    for (name, shapes, tolerance, f) in fallback_checks {
        checks.push(Check {
            name: name.into(),
            error: compare_op(gpu, shapes, f)?,
            tolerance,
        });
    }
    ops::set_cuda_kernels(true);
    Ok(())
}
