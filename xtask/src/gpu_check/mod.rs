//! `cargo xtask gpu-check`: the CUDA path against the CPU reference, as a pass/fail table.
//! Each op's forward output and input/parameter gradients on the GPU are compared with the same
//! computation on the CPU (fresh random inputs, f32, relative error to the largest value): the
//! convolutions, weft's kernels (batch norm, ReLU, max-pool; in f32, and in bf16 and f16 in
//! [`half`]) and the Candle ops that other dtypes fall back to. Then ResNet-50 is compared in
//! f64: whole-graph gradients (Candle's autograd), the block-wise trainer's gradients (the
//! blocks' own backward) and parameters after one SGD step, and the losses of three steps. (In
//! f32 a ResNet-50 at batch 4 is too ill-conditioned to compare: BatchNorm over 16 values per
//! channel in the last stage makes even the CPU's f32 and f64 gradients differ by 28 %.) Run it
//! on a GPU machine whenever GPU code changes and record the table in `docs/gpu-checks.md`.
//! The rows are pushed by [`op_rows`] (single operations), [`buffer_rows`] (data movement and
//! statistics), the sections' own modules ([`half`], [`llama`], [`dropout`], …),
//! [`optimizers`] and [`end_to_end`] (ResNet-50 and a small GPT trained); the comparisons they
//! run live in [`single_ops`], [`resnet`], [`gpt`] and beside their rows.

#[cfg(feature = "cudnn")]
mod attention_dropout;
#[cfg(feature = "cudnn")]
mod attention_dropout_graph;
#[cfg(feature = "cudnn")]
mod attention_dropout_stats;
mod buffer_rows;
mod channels_last;
#[cfg(feature = "cudnn")]
mod conv_stats;
pub mod ddp;
mod dropout;
mod embedding;
mod end_to_end;
#[cfg(feature = "cudnn")]
mod fused_attention;
mod gpt;
mod half;
mod llama;
#[cfg(feature = "cuda")]
mod model_state_memory;
mod multi_gpu;
mod offload_gpt;
mod op_rows;
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
use candle_core::Device;
#[cfg(feature = "cudnn")]
use weft_tensor::ops;

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
    op_rows::rows(&gpu, &mut checks)?;
    buffer_rows::rows(&gpu, &mut checks)?;
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
    optimizers::rows(&gpu, &mut checks)?;
    end_to_end::rows(&gpu, &mut checks)?;
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
