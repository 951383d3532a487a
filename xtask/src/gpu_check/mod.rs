//! `cargo xtask gpu-check`: the CUDA path against the CPU reference, as a pass/fail table.
//! Each op's forward output and input/parameter gradients on the GPU are compared with the same
//! computation on the CPU (fresh random inputs, f32, relative error to the largest value): the
//! convolutions, weft's kernels (batch norm, ReLU, max-pool; in f32, and in bf16 and f16 in
//! [`half`]) and the Candle ops that other dtypes fall back to. Then ResNet-50 is compared in f64: whole-graph gradients (Candle's
//! autograd), the block-wise trainer's gradients (the blocks' own backward) and parameters
//! after one SGD step, and the losses of three steps. (In f32 a ResNet-50 at batch 4
//! is too ill-conditioned to compare: BatchNorm over 16 values per channel in the last stage
//! makes even the CPU's f32 and f64 gradients differ by 28 %.) Run it on a GPU machine whenever
//! GPU code changes and record the table in `docs/gpu-checks.md`. The comparisons live in
//! [`single_ops`] (single operations), [`resnet`] (ResNet-50 end to end) and [`gpt`] (a small
//! GPT end to end).

#[cfg(feature = "cudnn")]
mod attention_dropout;
#[cfg(feature = "cudnn")]
mod attention_dropout_graph;
#[cfg(feature = "cudnn")]
mod attention_dropout_stats;
mod channels_last;
#[cfg(feature = "cudnn")]
mod conv_stats;
pub mod ddp;
mod dropout;
mod embedding;
#[cfg(feature = "cudnn")]
mod fused_attention;
mod gpt;
mod half;
mod llama;
#[cfg(feature = "cuda")]
mod model_state_memory;
mod multi_gpu;
mod offload_gpt;
mod optimizers;
mod pool_special;
mod resnet;
mod running_update;
mod single_ops;
mod synced_batch_norm;
mod train_loop;
mod transposes;
mod zero;

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use weft_tensor::ops;

use self::resnet::{
    compare_f32_losses, compare_graph_launched_ahead, compare_graph_replay, compare_training,
    compare_whole_graph,
};
use self::single_ops::{
    compare_blend, compare_conv_backward_add, compare_graph_free_batch_norm, compare_multi_tensor,
    compare_op, compare_unscale, compare_update_running,
};

/// A convolution to check: name, input shape, weight shape, stride, padding.
type ConvCase = (&'static str, [usize; 4], [usize; 4], usize, usize);

/// One row of the table.
struct Check {
    name: String,
    error: f64,
    tolerance: f64,
}

/// Flags of `cargo xtask gpu-check`.
#[derive(Debug, clap::Args)]
pub struct GpuCheckArgs {
    /// Run one section's rows alone: attention (cuDNN's fused attention, without and with
    /// dropout of the weights), dropout (the device's masks, the GPT replayed with dropout) or
    /// memory (what a bf16 step holds between steps against its counted model states)
    #[arg(long)]
    only: Option<String>,
}

pub fn run(args: &GpuCheckArgs) -> Result<()> {
    let gpu = Device::new_cuda(0)?;
    #[cfg(feature = "cuda")]
    weft_tensor::cuda_runtime::configure(&gpu, Default::default())?;
    if let Some(section) = &args.only {
        return report(&section_rows(section, &gpu)?);
    }
    // Full fp32 products in the comparisons (cuDNN's TF32 default would blur them).
    #[cfg(feature = "cudnn")]
    ops::set_allow_tf32(false);
    println!(
        "gpu-check: convolutions through {}",
        if cfg!(feature = "cudnn") {
            "cuDNN (TF32 off for the checks)"
        } else {
            "Candle's CUDA kernels"
        }
    );
    let mut checks = Vec::new();
    // (name, kernel, stride, padding): every convolution shape of a torchvision ResNet.
    let convs = [
        ("conv2d 3x3 stride 1", 3, 1, 1),
        ("conv2d 3x3 stride 2", 3, 2, 1),
        ("conv2d 1x1 stride 1", 1, 1, 0),
        ("conv2d 1x1 stride 2", 1, 2, 0),
        ("conv2d 7x7 stride 2 pad 3", 7, 2, 3),
    ];
    for (name, k, stride, pad) in convs {
        let error = compare_op(&gpu, &[&[4, 8, 16, 16], &[16, 8, k, k]], |t| {
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
        let error = compare_op(&gpu, &[&x, &w], |t| ops::conv2d(&t[0], &t[1], stride, pad))?;
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
            error: compare_conv_backward_add(&gpu, x, w, stride_pad, DType::F32)?,
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
            error: compare_op(&gpu, shapes, f)?,
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
            error: compare_graph_free_batch_norm(&gpu, dims, (relu, false), DType::F32)?,
            tolerance: 1e-3,
        });
    }
    // A batch's pixels converted and normalised on the device (the trainer's GPU input).
    for (dtype, tolerance) in [(DType::F32, 1e-6), (DType::BF16, 8e-3)] {
        checks.push(Check {
            name: format!("pixels to normalised {dtype:?}, channels-last"),
            error: single_ops::compare_pixels(&gpu, dtype)?,
            // f32: one rounding of the division by 255 apart at most; bf16: that, rounded.
            tolerance,
        });
    }
    checks.push(Check {
        name: "batches uploaded on a copy stream while the device computes".into(),
        error: single_ops::compare_batch_uploads(&gpu)?,
        tolerance: 0.0,
    });
    checks.push(Check {
        name: "blend_into (running statistics)".into(),
        error: compare_blend(&gpu, DType::F32)?,
        tolerance: 1e-6,
    });
    checks.push(Check {
        name: "update_running_stats (mean, variance, count in one launch)".into(),
        error: compare_update_running(&gpu, DType::F32)?,
        tolerance: 1e-6,
    });
    for dtype in [DType::BF16, DType::F32, DType::F64] {
        checks.push(Check {
            name: format!("to_channels_last by tiles and by planes, {dtype:?}"),
            error: transposes::compare_to_channels_last(&gpu, dtype)?,
            tolerance: 0.0,
        });
    }
    for dtype in [DType::F32, DType::BF16] {
        for channels_last in [false, true] {
            let layout = if channels_last {
                "channels-last"
            } else {
                "NCHW"
            };
            checks.push(Check {
                name: format!("running statistics updated by the table kernel, {layout} {dtype:?}"),
                error: running_update::compare_running_update_in_kernel(
                    &gpu,
                    dtype,
                    channels_last,
                )?,
                tolerance: 0.0,
            });
        }
    }
    // The fused causal attention (the CPU computes in f64 inside): one tile, several tiles with
    // a ragged last one, GPT-2's head width over 300 tokens; and GPT-2's tanh GELU.
    for (name, shape) in [
        ("fused attention d4 T5", [2, 3, 5, 4]),
        ("fused attention d16 T70", [2, 3, 70, 16]),
        ("fused attention d64 T300", [1, 4, 300, 64]),
    ] {
        let error = compare_op(&gpu, &[&shape, &shape, &shape], |t| {
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
        error: compare_op(&gpu, &[&[64, 1000]], |t| {
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
        error: compare_op(&gpu, &[&[64, 1000]], |t| {
            let targets: Vec<u32> = (0..64).map(|i| i * 13 % 990).collect();
            let targets = Tensor::from_vec(targets, 64, t[0].device())?;
            ops::cross_entropy_rows(&t[0].to_dtype(DType::BF16)?, &targets, 990)
        })?,
        tolerance: 2f64.powi(-8),
    });
    checks.push(Check {
        name: "layer_norm 64 x 768".into(),
        error: compare_op(&gpu, &[&[64, 768], &[768], &[768]], |t| {
            ops::layer_norm(&t[0], &t[1], &t[2], 1e-5)
        })?,
        tolerance: 1e-5,
    });
    checks.push(Check {
        name: "gelu_tanh".into(),
        error: compare_op(&gpu, &[&[64, 300]], |t| ops::gelu_tanh(&t[0]))?,
        tolerance: 1e-5,
    });
    half::run(&gpu, &mut checks)?;
    llama::run(&gpu, &mut checks)?;
    embedding::run(&gpu, &mut checks)?;
    channels_last::run(&gpu, &mut checks)?;
    pool_special::run(&gpu, &mut checks)?;
    #[cfg(feature = "cudnn")]
    conv_stats::run(&gpu, &mut checks)?;
    #[cfg(feature = "cudnn")]
    fused_attention::run(&gpu, &mut checks)?;
    #[cfg(feature = "cudnn")]
    attention_dropout_rows(&gpu, &mut checks)?;
    dropout::run(&gpu, &mut checks)?;
    synced_batch_norm::run(&gpu, &mut checks)?;
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
            error: compare_op(&gpu, shapes, f)?,
            tolerance,
        });
    }
    ops::set_cuda_kernels(true);
    // The loss scale undone with the inf/NaN check, one pass: the same f32 products.
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        checks.push(Check {
            name: format!("unscale_and_check, {dtype:?}"),
            error: compare_unscale(&gpu, dtype)?,
            tolerance: 0.0,
        });
    }
    // Copies, and 16-bit gradients widened into an f32 buffer (exact either way).
    for (dtype, into) in [
        (DType::F32, DType::F32),
        (DType::F64, DType::F64),
        (DType::BF16, DType::F32),
        (DType::F16, DType::F32),
    ] {
        checks.push(Check {
            name: format!("copy_tensors, 61 tensors, {dtype:?} into {into:?}"),
            error: compare_multi_tensor(&gpu, dtype, into, (false, false))?,
            tolerance: 0.0,
        });
    }
    for dtype in [DType::BF16, DType::F16] {
        checks.push(Check {
            name: format!("copy_tensors, 61 tensors, {dtype:?} and F32 into F32 in one launch"),
            error: compare_multi_tensor(&gpu, dtype, DType::F32, (true, false))?,
            tolerance: 0.0,
        });
    }
    // Channels-last filters (convolutions' weight gradients) transposed by the copy itself.
    for (dtype, into, mixed) in [
        (DType::F32, DType::F32, false),
        (DType::BF16, DType::BF16, false),
        (DType::BF16, DType::F32, true),
        (DType::F16, DType::F32, true),
    ] {
        checks.push(Check {
            name: format!(
                "copy_tensors, 61 tensors, channels-last filters, {dtype:?}{} into {into:?}",
                if mixed { " and F32" } else { "" }
            ),
            error: compare_multi_tensor(&gpu, dtype, into, (mixed, true))?,
            tolerance: 0.0,
        });
    }
    // The same operations in the same order without fused multiply-adds: f32 bit-equal but
    // for an ulp of the bias corrections; f64 likewise.
    for (dtype, tolerance) in [(DType::F32, 1e-6), (DType::F64, 1e-13)] {
        for (name, config) in optimizers::configs() {
            checks.push(Check {
                name: format!("optimizer {name}, 61 tensors, groups, 5 steps, {dtype:?}"),
                error: optimizers::compare_optimizer(&config, &gpu, dtype)?,
                tolerance,
            });
        }
    }
    // fp32 master weights of 16-bit parameters: the same fp32 rule, rounded to nearest even
    // on both sides.
    for dtype in [DType::BF16, DType::F16] {
        for (name, config) in optimizers::configs() {
            checks.push(Check {
                name: format!("optimizer {name}, fp32 masters of {dtype:?} parameters"),
                error: optimizers::compare_mixed(&config, &gpu, dtype)?,
                tolerance: 0.0,
            });
        }
    }
    // Stepped in two parts, as under DDP's held last bucket: the same bits.
    for dtypes in [(DType::F32, DType::F32), (DType::BF16, DType::F32)] {
        for (name, config) in optimizers::configs() {
            checks.push(Check {
                name: format!("optimizer {name}, {dtypes:?}, stepped in two parts = in one"),
                error: optimizers::compare_in_parts(&config, &gpu, dtypes)?,
                tolerance: 0.0,
            });
        }
    }
    // A checkpoint of the optimizer keeps its fp32 master weights: resuming changes nothing.
    for (name, config) in optimizers::configs() {
        checks.push(Check {
            name: format!("optimizer {name}, bf16 params, resumed from its state"),
            error: optimizers::compare_resumed(&config, &gpu, DType::BF16)?,
            tolerance: 0.0,
        });
    }
    checks.push(Check {
        name: "ResNet-50 f64 whole-graph grads".into(),
        error: compare_whole_graph(&gpu)?,
        tolerance: 1e-6,
    });
    let (gpt_losses, gpt_params) = gpt::compare_gpt_training(&gpu)?;
    checks.push(Check {
        name: "GPT f64 3 AdamW steps, losses".into(),
        error: gpt_losses,
        tolerance: 1e-10,
    });
    checks.push(Check {
        name: "GPT f64 3 AdamW steps, parameters".into(),
        error: gpt_params,
        tolerance: 1e-10,
    });
    // bf16 rounds each activation to 2^-9 relative; over the model's ~30 ops a step and 20
    // AdamW updates on the same batch the losses drift apart by a fraction of a percent: 2 %.
    checks.push(Check {
        name: "GPT bf16-mixed tracks fp32 over 20 steps (d64 heads), losses".into(),
        error: gpt::compare_bf16_tracking(&gpu)?,
        tolerance: 0.02,
    });
    let (deterministic, graphed, spread) = gpt::compare_graph_replay(&gpu)?;
    checks.push(Check {
        name: "GPT bf16 8 steps, CUDA graph launched ahead = eager (deterministic), params".into(),
        error: deterministic,
        tolerance: 0.0,
    });
    // cuDNN's accumulating attention backward: the graph within twice the eager runs' spread
    // (at least one bf16 rounding step of the largest parameter).
    checks.push(Check {
        name: format!("GPT bf16 8 steps, CUDA graph launched ahead vs eager, params (eager spread {spread:.3e})"),
        error: graphed,
        tolerance: (2.0 * spread).max(2f64.powi(-8)),
    });
    let (grad_error, param_error, loss_error) = compare_training(&gpu)?;
    checks.push(Check {
        name: "ResNet-50 f64 step 1 gradients".into(),
        error: grad_error,
        tolerance: 1e-6,
    });
    checks.push(Check {
        name: "ResNet-50 f64 step 1 parameters".into(),
        error: param_error,
        tolerance: 1e-8,
    });
    checks.push(Check {
        name: "ResNet-50 f64 3 SGD steps, loss".into(),
        error: loss_error,
        tolerance: 1e-6,
    });
    let f32_losses = compare_f32_losses(&gpu)?;
    checks.push(Check {
        name: "ResNet-50 f32 first loss vs f64".into(),
        error: f32_losses.first_step,
        tolerance: 1e-5,
    });
    checks.push(Check {
        name: "ResNet-50 f32 3 SGD steps, loss vs f64".into(),
        error: f32_losses.all_steps,
        tolerance: f32_losses.all_steps_tolerance,
    });
    checks.push(Check {
        name: "ResNet-18 f64 6 steps: CUDA graph = eager".into(),
        error: compare_graph_replay(&gpu, false, false)?,
        tolerance: 1e-12,
    });
    checks.push(Check {
        name: "ResNet-18 f32 channels-last 6 steps, channels-last batch: CUDA graph = eager".into(),
        error: compare_graph_replay(&gpu, false, true)?,
        // The same kernels on the same data, but f32 sums whose order may differ run to run
        // (atomics in cuDNN's NHWC weight gradients; cuBLAS's kernels under stream capture):
        // 3.7e-5 measured after 6 steps. A wrong batch in the static buffer differs at O(1).
        tolerance: 1e-3,
    });
    checks.push(Check {
        name: "ResNet-18 f64 8 steps, another batch each: CUDA graph launched ahead = eager".into(),
        error: compare_graph_launched_ahead(&gpu)?,
        tolerance: 1e-12,
    });
    checks.push(Check {
        name: "train-resnet ResNet-20 14 steps, checkpoint after 7: launched ahead = read first \
               = eager"
            .into(),
        error: train_loop::compare_launched_ahead_loop()?,
        // --deterministic: the same kernels on the same batches in the same order.
        tolerance: 1e-6,
    });
    checks.push(Check {
        name: "ResNet-18 f64 6 steps with a loss scaler: CUDA graph = eager".into(),
        error: compare_graph_replay(&gpu, true, false)?,
        tolerance: 1e-12,
    });
    checks.push(Check {
        name: "ResNet-18 f64 3 steps: offloaded optimizer = on GPU".into(),
        error: resnet::compare_offload(&gpu)?,
        tolerance: 1e-12,
    });
    checks.push(Check {
        name: "train-gpt gpt-tiny 6 steps (fp32, bf16-mixed): offloaded optimizer = on GPU; \
               delayed update equal up to its first stale step"
            .into(),
        error: offload_gpt::compare_offloaded_gpt()?,
        // AdamW in f32 on the CPU against the GPU's kernel: the same formula, rounded in
        // another order (about 1e-7 relative a step, passed on by the normalised update).
        tolerance: 1e-4,
    });
    #[cfg(feature = "cuda")]
    checks.push(model_state_memory_row(&gpu)?);
    if multi_gpu::has_two_gpus() {
        multi_gpu::run(&mut checks)?;
    } else {
        println!("gpu-check: one GPU; the NCCL and two-GPU data-parallel rows need two");
    }

    report(&checks)
}

/// The memory a bf16-mixed step holds between steps against the model states it counts.
#[cfg(feature = "cuda")]
fn model_state_memory_row(gpu: &Device) -> Result<Check> {
    Ok(Check {
        name: "GPT bf16-mixed AdamW: device memory held between steps − the counted model states"
            .into(),
        error: model_state_memory::untracked_share(gpu)?,
        // cuBLAS's and cuDNN's workspaces and a few scalars beside 18 bytes a parameter; a
        // forgotten copy of the parameters in f32 would add 4 of the 18 (0.22).
        tolerance: 0.1,
    })
}

/// The rows of one section alone (`--only`).
fn section_rows(section: &str, gpu: &Device) -> Result<Vec<Check>> {
    match section {
        #[cfg(feature = "cudnn")]
        "attention" => {
            let mut checks = Vec::new();
            fused_attention::run(gpu, &mut checks)?;
            attention_dropout_rows(gpu, &mut checks)?;
            Ok(checks)
        }
        "dropout" => {
            let mut checks = Vec::new();
            dropout::run(gpu, &mut checks)?;
            Ok(checks)
        }
        #[cfg(feature = "cuda")]
        "memory" => Ok(vec![model_state_memory_row(gpu)?]),
        other => bail!(
            "gpu-check --only {other}: expected attention (in a cuDNN build), dropout or memory"
        ),
    }
}

/// The rows of cuDNN's fused attention with dropout: statistics, exactness against the
/// read-out mask, CUDA graph replays (a failing row, the reason printed, where they could not
/// run).
#[cfg(feature = "cudnn")]
fn attention_dropout_rows(gpu: &Device, checks: &mut Vec<Check>) -> Result<()> {
    if let Err(e) = attention_dropout::run(gpu, checks) {
        println!("gpu-check: attention dropout: {e:#}");
        checks.push(Check {
            name: "attention dropout (cuDNN): ran".into(),
            error: 1.0,
            tolerance: 0.0,
        });
    }
    attention_dropout_graph::run(gpu, checks);
    Ok(())
}

/// Prints the table; an error when a row failed.
fn report(checks: &[Check]) -> Result<()> {
    println!(
        "{:<44} {:>12} {:>10}  result",
        "check", "rel. error", "tolerance"
    );
    let mut failed = 0;
    for c in checks {
        let pass = c.error <= c.tolerance;
        failed += usize::from(!pass);
        println!(
            "{:<44} {:>12.3e} {:>10.1e}  {}",
            c.name,
            c.error,
            c.tolerance,
            if pass { "pass" } else { "FAIL" }
        );
    }
    if failed > 0 {
        bail!("{failed} of {} GPU checks failed", checks.len());
    }
    println!("all {} GPU checks passed", checks.len());
    Ok(())
}
