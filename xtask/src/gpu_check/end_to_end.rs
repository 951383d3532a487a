//! gpu-check's end-to-end rows: ResNet-50 and a small GPT trained on the GPU against the CPU in
//! f64 (whole-graph and block-wise gradients, parameters and losses after steps), bf16 tracking
//! fp32, CUDA graph replays and launching ahead against eager steps, the trainers' loops with a
//! checkpoint in between, a loss scaler, and the offloaded optimizer against the one on the GPU.

use anyhow::Result;
use candle_core::Device;

use super::resnet::{
    self, compare_f32_losses, compare_graph_launched_ahead, compare_graph_replay, compare_training,
    compare_whole_graph,
};
use super::{gpt, offload_gpt, train_loop, Check};

/// Pushes the end-to-end rows onto `checks`.
pub(super) fn rows(gpu: &Device, checks: &mut Vec<Check>) -> Result<()> {
    checks.push(Check {
        name: "ResNet-50 f64 whole-graph grads".into(),
        error: compare_whole_graph(gpu)?,
        tolerance: 1e-6,
    });
    let (gpt_losses, gpt_params) = gpt::compare_gpt_training(gpu)?;
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
        error: gpt::compare_bf16_tracking(gpu)?,
        tolerance: 0.02,
    });
    let (deterministic, graphed, spread) = gpt::compare_graph_replay(gpu)?;
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
    let (grad_error, param_error, loss_error) = compare_training(gpu)?;
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
    let f32_losses = compare_f32_losses(gpu)?;
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
        error: compare_graph_replay(gpu, false, false)?,
        tolerance: 1e-12,
    });
    checks.push(Check {
        name: "ResNet-18 f32 channels-last 6 steps, channels-last batch: CUDA graph = eager".into(),
        error: compare_graph_replay(gpu, false, true)?,
        // The same kernels on the same data, but f32 sums whose order may differ run to run
        // (atomics in cuDNN's NHWC weight gradients; cuBLAS's kernels under stream capture):
        // 3.7e-5 measured after 6 steps. A wrong batch in the static buffer differs at O(1).
        tolerance: 1e-3,
    });
    checks.push(Check {
        name: "ResNet-18 f64 8 steps, another batch each: CUDA graph launched ahead = eager".into(),
        error: compare_graph_launched_ahead(gpu)?,
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
        error: compare_graph_replay(gpu, true, false)?,
        tolerance: 1e-12,
    });
    checks.push(Check {
        name: "ResNet-18 f64 3 steps: offloaded optimizer = on GPU".into(),
        error: resnet::compare_offload(gpu)?,
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
    Ok(())
}
