//! The 16-bit kernels (bf16, f16) on the GPU against the CPU, which runs the same ops in f32 on
//! the same rounded inputs and rounds once: cuDNN convolutions (accumulating in f32), batch norm
//! (f32 statistics), ReLU, add + ReLU and max-pool, through the autograd graph and the
//! graph-free passes of blocks with their own backward; and the transformer's LayerNorm (its
//! forward through autograd, its fused backward graph-free), tanh GELU and bias add, at
//! widths that take the kernels' 16-byte vectors, their element-by-element path (widths not a
//! multiple of 8, a misaligned first element) and rows wider than the registers hold. Both
//! sides round each output once, so they differ by an ulp where their f32 sums, added in
//! another order, straddle a rounding boundary: the tolerances are a few units of the type's
//! rounding step relative to the largest value (2^-8 for bf16, 2^-11 for f16).

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_tensor::ops;

use super::single_ops::{
    compare_blend, compare_conv_backward_add, compare_graph_free_batch_norm, compare_op,
    compare_update_running, relative_error,
};
use super::Check;

pub(super) type Op<'a> = &'a dyn Fn(&[Tensor]) -> candle_core::Result<Tensor>;

/// `f` on the inputs rounded to `dtype`, its output widened back to f32 (so the comparison and
/// the gradients' weighting stay in f32).
fn rounded(dtype: DType, f: Op<'_>) -> impl Fn(&[Tensor]) -> candle_core::Result<Tensor> + '_ {
    move |t: &[Tensor]| {
        let narrow: Vec<Tensor> = t
            .iter()
            .map(|t| t.to_dtype(dtype))
            .collect::<candle_core::Result<_>>()?;
        f(&narrow)?.to_dtype(DType::F32)
    }
}

/// `f` on the inputs rounded to `dtype`: on the GPU in `dtype`, on the CPU in f32 on the same
/// rounded values with its output rounded once to `dtype` (the CPU's own 16-bit path of an op
/// need not compute in f32: the tanh GELU's forward there is Candle's, rounding after each
/// operation). Either output widened back to f32; the gradients flow back through the same
/// roundings on both sides.
pub(super) fn rounded_from_f32(
    dtype: DType,
    f: Op<'_>,
) -> impl Fn(&[Tensor]) -> candle_core::Result<Tensor> + '_ {
    move |t: &[Tensor]| {
        let narrow: Vec<Tensor> = t
            .iter()
            .map(|t| t.to_dtype(dtype))
            .collect::<candle_core::Result<_>>()?;
        if !t[0].device().is_cpu() {
            return f(&narrow)?.to_dtype(DType::F32);
        }
        let wide: Vec<Tensor> = narrow
            .iter()
            .map(|t| t.to_dtype(DType::F32))
            .collect::<candle_core::Result<_>>()?;
        f(&wide)?.to_dtype(dtype)?.to_dtype(DType::F32)
    }
}

type GraphFree<'a> = &'a dyn Fn(&[Tensor]) -> candle_core::Result<Vec<Tensor>>;

/// The largest relative error between the outputs of the graph-free pass `f` on the GPU, on
/// inputs of `shapes` drawn in f32 and rounded to `dtype`, and on the CPU in f32 on the same
/// rounded values with each output rounded once to `dtype`; infinite if a GPU output is not
/// of `dtype` (the 16-bit kernels' results are).
fn compare_graph_free(
    gpu: &Device,
    dtype: DType,
    shapes: &[&[usize]],
    f: GraphFree<'_>,
) -> Result<f64> {
    let t = inputs(dtype, shapes)?;
    let wide: Vec<Tensor> = t
        .iter()
        .map(|t| t.to_dtype(DType::F32))
        .collect::<candle_core::Result<_>>()?;
    let cpu: Vec<Tensor> = f(&wide)?
        .iter()
        .map(|t| t.to_dtype(dtype))
        .collect::<candle_core::Result<_>>()?;
    let on_gpu = f(&t
        .iter()
        .map(|t| t.to_device(gpu))
        .collect::<candle_core::Result<Vec<_>>>()?)?;
    if on_gpu.iter().any(|t| t.dtype() != dtype) {
        return Ok(f64::INFINITY);
    }
    let on_gpu: Vec<Tensor> = on_gpu
        .iter()
        .map(|t| t.to_device(&Device::Cpu))
        .collect::<candle_core::Result<_>>()?;
    worst(&cpu, &on_gpu)
}

/// `t`'s values, contiguous, one element into a new buffer: a first element not 16-byte
/// aligned, so that the kernels take their element-by-element path.
fn misaligned(t: &Tensor) -> candle_core::Result<Tensor> {
    let flat = t.flatten_all()?;
    Tensor::cat(&[&flat.narrow(0, 0, 1)?, &flat], 0)?
        .narrow(0, 1, t.elem_count())?
        .reshape(t.shape())
}

/// Adds the transformer's 16-bit rows (LayerNorm, tanh GELU, bias add) for `dtype` to `checks`.
fn transformer_rows(
    gpu: &Device,
    dtype: DType,
    tolerance: f64,
    checks: &mut Vec<Check>,
) -> Result<()> {
    let ln = |t: &[Tensor]| ops::layer_norm(&t[0], &t[1], &t[2], 1e-5);
    let ln_misaligned = |t: &[Tensor]| ops::layer_norm(&misaligned(&t[0])?, &t[1], &t[2], 1e-5);
    let gelu = |t: &[Tensor]| ops::gelu_tanh(&t[0]);
    // The forward through autograd (output and the gradients of x, weight and bias: the op's
    // backward is the fused 16-bit one on the GPU): 16-byte vectors (768, and 1600, beyond the
    // registers), single columns (100, and 1001, beyond the registers), a 3-d input whose first
    // element is misaligned.
    let autograd: [(&str, &[&[usize]], Op<'_>); 6] = [
        ("layer_norm 64 x 768", &[&[64, 768], &[768], &[768]], &ln),
        (
            "layer_norm 33 x 1600",
            &[&[33, 1600], &[1600], &[1600]],
            &ln,
        ),
        ("layer_norm 50 x 100", &[&[50, 100], &[100], &[100]], &ln),
        (
            "layer_norm 40 x 1001",
            &[&[40, 1001], &[1001], &[1001]],
            &ln,
        ),
        (
            "layer_norm 2 x 32 x 768, misaligned",
            &[&[2, 32, 768], &[768], &[768]],
            &ln_misaligned,
        ),
        ("gelu_tanh 63 x 301", &[&[63, 301]], &gelu),
    ];
    for (name, shapes, f) in autograd {
        checks.push(Check {
            name: format!("{dtype:?} {name}"),
            error: compare_op(gpu, shapes, rounded_from_f32(dtype, f))?,
            tolerance,
        });
    }
    let ln_backward = |t: &[Tensor]| {
        let (dx, dw, db) = ops::layer_norm_backward(&t[0], &t[1], &t[2], &t[3], 1e-5)?;
        Ok(vec![dx, dw, db])
    };
    let ln_backward_misaligned = |t: &[Tensor]| {
        let (x, dy) = (misaligned(&t[0])?, misaligned(&t[3])?);
        let (dx, dw, db) = ops::layer_norm_backward(&x, &t[1], &t[2], &dy, 1e-5)?;
        Ok(vec![dx, dw, db])
    };
    let gelu_backward = |t: &[Tensor]| Ok(vec![ops::gelu_tanh_backward(&t[0], &t[1])?]);
    let gelu_backward_misaligned = |t: &[Tensor]| {
        let (x, dy) = (misaligned(&t[0])?, misaligned(&t[1])?);
        Ok(vec![ops::gelu_tanh_backward(&x, &dy)?])
    };
    let bias = |t: &[Tensor]| Ok(vec![ops::add_bias(&t[0], &t[1])?]);
    let bias_misaligned = |t: &[Tensor]| Ok(vec![ops::add_bias(&misaligned(&t[0])?, &t[1])?]);
    let bias_residual = |t: &[Tensor]| Ok(vec![ops::add_bias_residual(&t[0], &t[1], &t[2])?]);
    let residual_add = |t: &[Tensor]| Ok(vec![ops::residual_add(&t[0], &t[1])?]);
    let ln_shapes = |rows: usize, cols: usize| -> [Vec<usize>; 4] {
        [vec![rows, cols], vec![cols], vec![cols], vec![rows, cols]]
    };
    // The graph-free passes: LayerNorm's fused backward (dx, dw, db; 4096 rows: many blocks'
    // partial sums; 6144 columns: the widest, one warp a block), the GELU's backward (a tail
    // of 3 elements after the vectors), the bias add, the bias and residual added in one pass
    // and the residual sum (a tail of 3 elements after the vectors).
    let graph_free: [(&str, Vec<Vec<usize>>, GraphFree<'_>); 14] = [
        (
            "layer_norm_backward 4096 x 768",
            ln_shapes(4096, 768).into(),
            &ln_backward,
        ),
        (
            "layer_norm_backward 50 x 100",
            ln_shapes(50, 100).into(),
            &ln_backward,
        ),
        (
            "layer_norm_backward 40 x 1001",
            ln_shapes(40, 1001).into(),
            &ln_backward,
        ),
        (
            "layer_norm_backward 8 x 6144",
            ln_shapes(8, 6144).into(),
            &ln_backward,
        ),
        (
            "layer_norm_backward 64 x 768, misaligned",
            ln_shapes(64, 768).into(),
            &ln_backward_misaligned,
        ),
        (
            "gelu_tanh_backward 63 x 301",
            vec![vec![63, 301], vec![63, 301]],
            &gelu_backward,
        ),
        (
            "gelu_tanh_backward 63 x 301, misaligned",
            vec![vec![63, 301], vec![63, 301]],
            &gelu_backward_misaligned,
        ),
        ("add_bias 64 x 768", vec![vec![64, 768], vec![768]], &bias),
        ("add_bias 50 x 100", vec![vec![50, 100], vec![100]], &bias),
        (
            "add_bias 64 x 768, misaligned",
            vec![vec![64, 768], vec![768]],
            &bias_misaligned,
        ),
        (
            "add_bias_residual 64 x 768",
            vec![vec![64, 768], vec![768], vec![64, 768]],
            &bias_residual,
        ),
        (
            "add_bias_residual 50 x 100",
            vec![vec![50, 100], vec![100], vec![50, 100]],
            &bias_residual,
        ),
        (
            "residual_add 64 x 768",
            vec![vec![64, 768], vec![64, 768]],
            &residual_add,
        ),
        (
            "residual_add 63 x 301",
            vec![vec![63, 301], vec![63, 301]],
            &residual_add,
        ),
    ];
    for (name, shapes, f) in graph_free {
        let shapes: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
        checks.push(Check {
            name: format!("{dtype:?} {name}"),
            error: compare_graph_free(gpu, dtype, &shapes, f)?,
            tolerance,
        });
    }
    Ok(())
}

/// Adds the 16-bit rows to `checks`.
pub(super) fn run(gpu: &Device, checks: &mut Vec<Check>) -> Result<()> {
    let conv3 = |t: &[Tensor]| ops::conv2d(&t[0], &t[1], 1, 1);
    let conv1_2 = |t: &[Tensor]| ops::conv2d(&t[0], &t[1], 2, 0);
    let stem = |t: &[Tensor]| ops::conv2d(&t[0], &t[1], 2, 3);
    let bn = |t: &[Tensor]| Ok(ops::batch_norm_train(&t[0], &t[1], &t[2], 1e-5)?.0);
    let bn_relu = |t: &[Tensor]| Ok(ops::batch_norm_relu_train(&t[0], &t[1], &t[2], 1e-5)?.0);
    let relu = |t: &[Tensor]| ops::relu(&t[0]);
    let add_relu = |t: &[Tensor]| ops::add_relu(&t[0], &t[1]);
    let pool = |t: &[Tensor]| ops::max_pool2d(&t[0], 3, 2, 1);
    let cases: [(&str, &[&[usize]], Op<'_>); 8] = [
        (
            "conv2d 3x3 @16 (64->64)",
            &[&[4, 64, 16, 16], &[64, 64, 3, 3]],
            &conv3,
        ),
        (
            "conv2d 1x1/2 @8 (256->512)",
            &[&[4, 256, 8, 8], &[512, 256, 1, 1]],
            &conv1_2,
        ),
        (
            "conv2d stem 7x7/2 @64",
            &[&[4, 3, 64, 64], &[64, 3, 7, 7]],
            &stem,
        ),
        (
            "batch_norm_train @56 (split)",
            &[&[8, 64, 56, 56], &[64], &[64]],
            &bn,
        ),
        (
            "batch_norm_relu_train @7",
            &[&[8, 256, 7, 7], &[256], &[256]],
            &bn_relu,
        ),
        ("relu", &[&[4, 64, 32, 32]], &relu),
        ("add_relu", &[&[4, 64, 32, 32], &[4, 64, 32, 32]], &add_relu),
        ("max_pool2d @112", &[&[2, 64, 112, 112]], &pool),
    ];
    for (dtype, unit) in [(DType::BF16, 2f64.powi(-8)), (DType::F16, 2f64.powi(-11))] {
        let tolerance = 4.0 * unit;
        // The transformer's kernels compute in f32 as the CPU does and round each output once
        // (a unit apart at most where the two f32 results straddle a rounding boundary); the
        // gradients of autograd's rows also pass the output's weighting through one rounding
        // on both sides. Measured on an H200: 2.0e-3 at most in bf16 (half a unit, LayerNorm's
        // backward over 4096 rows), 3.6e-4 in f16.
        transformer_rows(gpu, dtype, tolerance, checks)?;
        for (name, shapes, f) in cases {
            checks.push(Check {
                name: format!("{dtype:?} {name}"),
                error: compare_op(gpu, shapes, rounded(dtype, f))?,
                tolerance,
            });
        }
        checks.push(Check {
            name: format!("{dtype:?} graph-free batch norm + ReLU @28"),
            error: compare_graph_free_batch_norm(gpu, [8, 128, 28, 28], (true, false), dtype)?,
            tolerance,
        });
        checks.push(Check {
            name: format!("{dtype:?} graph-free conv2d 1x1/2 (NHWC)"),
            error: graph_free_conv(gpu, dtype, ONE_BY_ONE)?,
            tolerance,
        });
        // The filter transposed into KRSC (forward, input gradient) and its gradient back.
        checks.push(Check {
            name: format!("{dtype:?} graph-free conv2d 3x3/1 (NHWC, filters transposed)"),
            error: graph_free_conv(gpu, dtype, THREE_BY_THREE)?,
            tolerance,
        });
        // Stride 2 over three channels: bf16 runs lowered by space-to-depth on the GPU.
        let lowering = if dtype == DType::BF16 {
            ", space-to-depth"
        } else {
            ""
        };
        checks.push(Check {
            name: format!("{dtype:?} graph-free conv2d stem 7x7/2 (NHWC{lowering})"),
            error: graph_free_conv(gpu, dtype, STEM)?,
            tolerance,
        });
        checks.push(Check {
            name: format!(
                "{dtype:?} stem 7x7/2 from ConvOperands (restored) = the direct passes, channels-last"
            ),
            error: operands_against_direct(gpu, dtype, STEM)?,
            tolerance: unit,
        });
        checks.push(Check {
            name: format!("{dtype:?} conv2d_backward_add 3x3 @16"),
            error: compare_conv_backward_add(gpu, [4, 64, 16, 16], [64, 64, 3, 3], (1, 1), dtype)?,
            // cuDNN's beta = 1 rounds the input gradient to 16 bits before adding it (the CPU
            // adds in f32): two roundings, measured up to 2.9 units.
            tolerance: 2.0 * tolerance,
        });
        checks.push(Check {
            name: format!("{dtype:?} running statistics from f32"),
            error: compare_blend(gpu, dtype)?,
            // The f32 blend may differ in its last bit between the GPU's fused multiply-add
            // and the CPU's two roundings; rounded to 16 bits that is one unit at most (seen
            // once in bf16: 6.2e-4 relative to the largest value; exact in every other call).
            tolerance: unit,
        });
        checks.push(Check {
            name: format!("{dtype:?} running statistics and count in one launch"),
            error: compare_update_running(gpu, dtype)?,
            // As the blend's row, twice over: a unit per blend at most.
            tolerance: 2.0 * unit,
        });
    }
    Ok(())
}

/// The largest relative error between a convolution's output, input gradient and weight
/// gradient on the GPU, channels-last, through `ops::ConvOperands` (prepared once, the backward
/// from the saved tensors restored: a bf16 stem's blocks built once) and through the direct
/// passes (`conv2d_forward`, `conv2d_backward`), infinite if a shape or layout differs. The same
/// kernels on the same operands: equal but for cuDNN's weight-gradient algorithms that add with
/// atomics in any order.
fn operands_against_direct(gpu: &Device, dtype: DType, case: ConvCase) -> Result<f64> {
    let (x_dims, w_dims, dy_dims, stride, padding) = case;
    let t = inputs(dtype, &[&x_dims, &w_dims, &dy_dims])?;
    let x = ops::to_channels_last(&t[0].to_device(gpu)?)?;
    let w = (t[1].to_device(gpu)? * 0.1)?;
    let dy = ops::to_channels_last(&t[2].to_device(gpu)?)?;
    let operands = ops::ConvOperands::new(&x, &w, stride, padding)?;
    let y = operands.forward()?;
    let restored = ops::ConvOperands::restore(operands.saved(), &w, stride, padding)?;
    let (dx, dw) = restored.backward(&dy, true)?;
    let filter = ops::conv2d_filter_for(&x, &w)?;
    let direct_y = ops::conv2d_forward(&x, &filter, stride, padding)?;
    let (direct_dx, direct_dw) = ops::conv2d_backward(&x, &filter, &dy, stride, padding, true)?;
    let dx = dx.expect("asked for");
    let direct_dx = direct_dx.expect("asked for");
    let mut worst = 0f64;
    for (a, b) in [(direct_y, y), (direct_dx, dx), (direct_dw, dw)] {
        if a.dims() != b.dims() || ops::is_channels_last(&a) != ops::is_channels_last(&b) {
            return Ok(f64::INFINITY);
        }
        worst = worst.max(relative_error(&a, &b)?);
    }
    Ok(worst)
}

/// Seeded-by-Candle random inputs on the CPU, rounded to `dtype`.
fn inputs(dtype: DType, shapes: &[&[usize]]) -> Result<Vec<Tensor>> {
    shapes
        .iter()
        .map(|s| Ok(Tensor::randn(0f32, 1.0, *s, &Device::Cpu)?.to_dtype(dtype)?))
        .collect()
}

/// The largest relative error over pairs of CPU and GPU results.
fn worst(cpu: &[Tensor], gpu: &[Tensor]) -> Result<f64> {
    cpu.iter()
        .zip(gpu)
        .try_fold(0f64, |m, (a, b)| Ok(m.max(relative_error(a, b)?)))
}

/// A convolution's input, filter and output-gradient shapes, stride and padding.
pub(super) type ConvCase = ([usize; 4], [usize; 4], [usize; 4], usize, usize);
const ONE_BY_ONE: ConvCase = ([4, 256, 14, 14], [512, 256, 1, 1], [4, 512, 7, 7], 2, 0);
const THREE_BY_THREE: ConvCase = ([4, 64, 14, 14], [96, 64, 3, 3], [4, 96, 14, 14], 1, 1);
pub(super) const STEM: ConvCase = ([4, 3, 30, 30], [64, 3, 7, 7], [4, 64, 15, 15], 2, 3);

/// The graph-free forward and backward of a convolution (through NHWC on the GPU): output,
/// input and weight gradients.
fn graph_free_conv(gpu: &Device, dtype: DType, case: ConvCase) -> Result<f64> {
    graph_free_conv_in(gpu, dtype, case, false)
}

/// [`graph_free_conv`] with the GPU's input and output gradient channels-last when
/// `channels_last` (the NHWC path of every dtype; otherwise 16-bit NCHW tensors copied through
/// NHWC).
pub(super) fn graph_free_conv_in(
    gpu: &Device,
    dtype: DType,
    case: ConvCase,
    channels_last: bool,
) -> Result<f64> {
    let (x_dims, w_dims, dy_dims, stride, padding) = case;
    let t = inputs(dtype, &[&x_dims, &w_dims, &dy_dims])?;
    let run = |device: &Device| -> Result<Vec<Tensor>> {
        let (mut x, w, mut dy) = (
            t[0].to_device(device)?,
            (t[1].to_device(device)? * 0.1)?,
            t[2].to_device(device)?,
        );
        if channels_last && device.is_cuda() {
            (x, dy) = (ops::to_channels_last(&x)?, ops::to_channels_last(&dy)?);
        }
        ops::set_conv_nhwc(true);
        let passes = ops::conv2d_forward(&x, &w, stride, padding).and_then(|y| {
            let grads = ops::conv2d_backward(&x, &w, &dy, stride, padding, true)?;
            Ok((y, grads))
        });
        ops::set_conv_nhwc(false);
        let (y, (dx, dw)) = passes?;
        [y, dx.expect("asked for"), dw]
            .iter()
            .map(|t| Ok(t.to_device(&Device::Cpu)?))
            .collect()
    };
    worst(&run(&Device::Cpu)?, &run(gpu)?)
}
