//! The fused attention's dropout replayed from a CUDA graph: the forward and backward of the
//! read-out setup of [`super::attention_dropout`] (q = k = 0, v and the output's gradient the
//! identity, so the output is the forward's dropped weights and `dV` the backward's) captured once,
//! then replayed after `ops::set_dropout_step` writes a step value, as a trainer does before each
//! replay. Rows: a replay equals the eager pass at the same step value (bits); a replay at another
//! step value draws independent masks (the allowed weights' agreement (1 − p)² + p² = 0.82, at most
//! 0.85, where the same masks give 1); within each replay the backward's mask is the forward's; the
//! first step value written again gives the first replay's bits.

use anyhow::{Context, Result};
use candle_core::cuda_backend::cudarc::driver::sys::{
    CUgraphInstantiate_flags, CUstreamCaptureMode,
};
use candle_core::cuda_backend::cudarc::driver::CudaGraph;
use candle_core::{DType, Device, Tensor};
use weft_tensor::ops;

use super::attention_dropout::{
    check, differing, fused, heads, kept, mask_agreement, read_masks, readout_inputs, READOUT,
};
use super::Check;

/// The forward and backward of the read-out setup into static buffers (output, gradient).
fn step(qkv: &Tensor, identity: &Tensor, into: &[Tensor; 2]) -> Result<()> {
    let (_, t, h) = READOUT;
    let (out, d_qkv) = fused(qkv, Some(identity), heads(h, t), 5)?;
    let d_qkv = d_qkv.context("gradient")?;
    ops::copy_tensors(&[(&out, &into[0]), (&d_qkv, &into[1])])?;
    Ok(())
}

/// Captures [`step`] on `gpu`'s stream after one eager run (which caches its uploads).
fn capture(gpu: &Device, qkv: &Tensor, identity: &Tensor, into: &[Tensor; 2]) -> Result<CudaGraph> {
    let cuda = gpu.as_cuda_device()?;
    let _cache = cuda.enable_cuda_graph_htod_cache();
    step(qkv, identity, into)?;
    gpu.synchronize()?;
    let stream = cuda.cuda_stream();
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let body = step(qkv, identity, into);
    let graph = stream
        .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    body?;
    graph?.context("the capture recorded no work")
}

/// The forward's and backward's masks in the static buffers, after `graph` replays at `step`.
fn replay(gpu: &Device, graph: &CudaGraph, value: u64, into: &[Tensor; 2]) -> Result<[Tensor; 2]> {
    ops::set_dropout_step(gpu, value)?;
    graph.launch()?;
    gpu.synchronize()?;
    let (forward, backward) = read_masks(&into[0], &into[1])?;
    Ok([kept(&forward)?, kept(&backward)?])
}

fn rows(gpu: &Device, checks: &mut Vec<Check>) -> Result<()> {
    let dtype = DType::BF16;
    let (qkv, identity) = readout_inputs(dtype, gpu)?;
    let (b, t, h) = READOUT;
    let into = [
        Tensor::zeros((b, t, h * t), dtype, gpu)?,
        Tensor::zeros((b, t, 3 * h * t), dtype, gpu)?,
    ];
    ops::set_dropout_step(gpu, 1)?;
    step(&qkv, &identity, &into)?;
    let eager = read_masks(&into[0], &into[1])?.0;
    let graph = capture(gpu, &qkv, &identity, &into)?;
    let first = replay(gpu, &graph, 1, &into)?;
    let first_out = read_masks(&into[0], &into[1])?.0;
    let second = replay(gpu, &graph, 2, &into)?;
    let again = replay(gpu, &graph, 1, &into)?;
    ops::set_dropout_step(gpu, 0)?;
    let name = "BF16 attention dropout (cuDNN) replayed from a CUDA graph";
    checks.push(check(
        format!("{name}: replay = eager at the same step value, elements differing"),
        differing(&eager, &first_out)?,
        0.0,
    ));
    checks.push(check(
        format!("{name}: replay at another step value, masks' agreement (0.82 expected)"),
        mask_agreement(&first[0], &second[0])?,
        0.85,
    ));
    let mismatched = differing(&first[0], &first[1])? + differing(&second[0], &second[1])?;
    checks.push(check(
        format!("{name}: backward's masks ≠ forward's in each replay, elements"),
        mismatched,
        0.0,
    ));
    checks.push(check(
        format!("{name}: the first step value again, mask elements differing"),
        differing(&first[0], &again[0])?,
        0.0,
    ));
    Ok(())
}

/// Adds the CUDA graph rows to `checks` (a failing row, with the reason printed, where the
/// capture or a replay failed).
pub(super) fn run(gpu: &Device, checks: &mut Vec<Check>) {
    if let Err(e) = rows(gpu, checks) {
        println!("gpu-check: attention dropout in a CUDA graph: {e:#}");
        checks.push(check(
            "BF16 attention dropout (cuDNN) replayed from a CUDA graph: ran".into(),
            1.0,
            0.0,
        ));
    }
}
