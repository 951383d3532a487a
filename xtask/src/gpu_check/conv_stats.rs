//! The convolution that sums its output for the batch norm after it (cuDNN's convolution +
//! GenStats graph, `ops::conv2d_forward_with_sums`) against the separate passes on the same
//! channels-last 16-bit tensors: the output, and the batch norm's table and output from the
//! sums against those from weft's moments pass; and a second run of the same shape, whose sums
//! must not have been added onto the first's.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_tensor::ops;
use weft_tensor::ops::BatchStats::Local;

use super::single_ops::relative_error;
use super::Check;

/// A convolution: its name, input dims, filter dims, stride, padding.
type Shape = (&'static str, [usize; 4], [usize; 4], usize, usize);

/// ResNet-50's kinds of convolution at batch 8.
const SHAPES: [Shape; 5] = [
    ("1x1 @56 (64->256)", [8, 64, 56, 56], [256, 64, 1, 1], 1, 0),
    ("3x3 @56 (64->64)", [8, 64, 56, 56], [64, 64, 3, 3], 1, 1),
    (
        "3x3/2 @28 (128->128)",
        [8, 128, 28, 28],
        [128, 128, 3, 3],
        2,
        1,
    ),
    (
        "1x1/2 @14 (1024->2048)",
        [8, 1024, 14, 14],
        [2048, 1024, 1, 1],
        2,
        0,
    ),
    (
        "stem 7x7/2 @224 (3->64)",
        [8, 3, 224, 224],
        [64, 3, 7, 7],
        2,
        3,
    ),
];

/// Adds the rows to `checks`: per dtype, the worst of the shapes cuDNN fuses (a row of
/// infinite error when it fuses none).
pub(super) fn run(gpu: &Device, checks: &mut Vec<Check>) -> Result<()> {
    // Every shape cuDNN has an engine for, faster or not: the rows check the fused kernel.
    ops::set_conv_stats(ops::ConvStats::Always);
    let rows = (|| {
        for dtype in [DType::BF16, DType::F16] {
            rows(gpu, dtype, checks)?;
        }
        Ok(())
    })();
    ops::set_conv_stats(ops::ConvStats::WhereFaster);
    rows
}

/// The rows of one dtype.
fn rows(gpu: &Device, dtype: DType, checks: &mut Vec<Check>) -> Result<()> {
    let (mut outputs, mut tables, mut repeat, mut fused) = (0f64, 0f64, 0f64, 0);
    for (name, x_dims, w_dims, stride, padding) in SHAPES {
        let Some([y, table, again]) = compare(gpu, dtype, (x_dims, w_dims), stride, padding)?
        else {
            println!("conv + sums {name} {dtype:?}: not fused");
            continue;
        };
        println!(
            "conv + sums {name} {dtype:?}: outputs {y:.2e}, tables {table:.2e}, second run {again:.2e}"
        );
        fused += 1;
        (outputs, tables, repeat) = (outputs.max(y), tables.max(table), repeat.max(again));
    }
    for line in ops::conv_stats_plans() {
        println!("  {line}");
    }
    let none = |e: f64| if fused == 0 { f64::INFINITY } else { e };
    // Both outputs are the same f32 sums rounded once; cuDNN's fused kernel may add them in
    // another order: an ulp of the type where they straddle a rounding boundary, relative
    // to the largest value (2^-8 bf16, 2^-11 f16), then through the batch norm's scale.
    let ulp = match dtype {
        DType::BF16 => 2f64.powi(-8),
        _ => 2f64.powi(-11),
    };
    checks.push(Check {
        name: format!("conv + sums ({fused} of 5 shapes fused): output, {dtype:?}"),
        error: none(outputs),
        tolerance: 2.0 * ulp,
    });
    // Mean and variance from f32 sums of the rounded outputs against the moments pass
    // (double sums about a shift) over the same outputs: f32 rounding over up to 200,704
    // elements a channel, far below the outputs' own rounding; the batch norm's output
    // then within a few of its ulps.
    checks.push(Check {
        name: format!("conv + sums: batch-norm table and output from the sums, {dtype:?}"),
        error: none(tables),
        tolerance: 4.0 * ulp,
    });
    checks.push(Check {
        name: format!("conv + sums: a second run sums afresh, {dtype:?}"),
        error: none(repeat),
        tolerance: 1e-5,
    });
    Ok(())
}

/// The fused pass against the separate ones for one shape: the outputs' error, the batch
/// norm's (table and output), the second run's sums against the first's; `None` if not fused.
fn compare(
    gpu: &Device,
    dtype: DType,
    (x_dims, w_dims): ([usize; 4], [usize; 4]),
    stride: usize,
    padding: usize,
) -> Result<Option<[f64; 3]>> {
    let draw = |dims: &[usize], std: f64| -> Result<Tensor> {
        Ok(Tensor::randn(0f32, std as f32, dims, gpu)?.to_dtype(dtype)?)
    };
    let x = ops::to_channels_last(&(draw(&x_dims, 1.0)? + 0.5)?)?;
    let fan_in = (w_dims[1] * w_dims[2] * w_dims[3]) as f64;
    let w = ops::to_channels_last(&draw(&w_dims, fan_in.sqrt().recip())?)?;
    let c = w_dims[0];
    let (gamma, beta) = ((draw(&[c], 0.2)? + 1.0)?, draw(&[c], 0.2)?);
    let Some((y, sums)) = ops::conv2d_forward_with_sums(&x, &w, stride, padding)? else {
        return Ok(None);
    };
    let separate = ops::conv2d_forward(&x, &w, stride, padding)?;
    let from_sums =
        ops::batch_norm_train_forward_from_sums(&y, &sums, (&gamma, &beta), 1e-5, true, Local)?;
    let moments = ops::batch_norm_train_forward(&y, &gamma, &beta, 1e-5, true, Local)?;
    let tables = relative_error(&moments.table.get(0)?, &from_sums.table.get(0)?)?
        .max(relative_error(
            &moments.table.get(1)?,
            &from_sums.table.get(1)?,
        )?)
        .max(relative_error(&moments.y, &from_sums.y)?);
    let (_, again) = ops::conv2d_forward_with_sums(&x, &w, stride, padding)?
        .ok_or_else(|| anyhow::anyhow!("conv + sums: fused once, then not"))?;
    let kept = ops::is_channels_last(&y) && y.dims() == separate.dims();
    let outputs = match kept {
        true => relative_error(&separate, &y)?,
        false => f64::INFINITY,
    };
    Ok(Some([outputs, tables, relative_error(&sums, &again)?]))
}
