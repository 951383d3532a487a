//! Dropout on the device (`ops::dropout`'s kernel, its step value in device memory) against
//! the host's masks, bit for bit, forward and backward, in f32, bf16 and f16; the GPT's blocks'
//! own backward with dropout against Candle's graph; and `train-gpt` with dropout replayed from
//! a CUDA graph against the same run eager: the replays draw each step's masks, not the
//! captured step's.

use std::path::{Path, PathBuf};

use anyhow::Result;
use candle_core::{DType, Device, Tensor, Var};
use weft_models::gpt::{gpt, GptConfig};
use weft_models::loss::NextToken;
use weft_tensor::ops::dropout::{self, Dropout, Placement};
use weft_tensor::{ops, tape, Checkpointing, Mode, Objective};

use super::train_loop::{graph_launches, step_losses, tiny_gpt_run};
use super::Check;

/// The rows.
pub(super) fn run(gpu: &Device, checks: &mut Vec<Check>) -> Result<()> {
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        checks.push(Check {
            name: format!("dropout {dtype:?} on the device = the host's masks (fwd, bwd)"),
            error: device_against_host(gpu, dtype, STEP)?,
            // The same hash, the same f32 product rounded once.
            tolerance: 0.0,
        });
    }
    checks.push(Check {
        name: "dropout: the next step's value draws another mask (agreement)".into(),
        error: next_step_agreement(gpu)?,
        // Two independent masks at p = 0.3 agree on 0.7² + 0.3² = 58 % of the elements.
        tolerance: 0.65,
    });
    checks.push(Check {
        name: "GPT bf16 --dropout 0.1: the blocks' own backward = Candle's graph (rel. L2)".into(),
        error: explicit_against_graph(gpu)?,
        // The same masks (the fused attention's from the same Philox seed, the others from the
        // same hash); bf16 sums in another order: a few 2^-8 relative.
        tolerance: 2e-2,
    });
    checks.push(Check {
        name: "train-gpt gpt-tiny bf16 --dropout 0.1 8 steps: CUDA graph replays = eager".into(),
        error: replayed_against_eager()?,
        // --deterministic: the same kernels, the same masks, in the same order.
        tolerance: 1e-5,
    });
    Ok(())
}

const STEP: u64 = 41;

fn dropout_at(step: u64) -> Dropout {
    Dropout {
        p: 0.3,
        seed: 0x5eed,
        step,
        placement: Some(Placement {
            axis: 1,
            offset: 2,
            total: 10,
        }),
    }
}

/// `x`'s dropout and the gradient of `Σ dropout(x) · g` on `device` (the step's value written
/// there first), as f32 on the CPU.
fn dropped(x: &Tensor, g: &Tensor, device: &Device, step: u64) -> Result<(Tensor, Tensor)> {
    ops::set_dropout_step(device, step)?;
    let var = Var::from_tensor(&x.to_device(device)?)?;
    let y = dropout::dropout(var.as_tensor(), &dropout_at(step))?;
    let loss = (&y * g.to_device(device)?)?.sum_all()?;
    let grads = loss.backward()?;
    let dx = grads.get(var.as_tensor()).expect("x takes part");
    let host = |t: &Tensor| t.to_device(&Device::Cpu)?.to_dtype(DType::F32);
    Ok((host(&y)?, host(dx)?))
}

/// The largest difference between the device's and the host's dropout and its gradient.
fn device_against_host(gpu: &Device, dtype: DType, step: u64) -> Result<f64> {
    let shape = (4, 6, 5, 7);
    let x = Tensor::randn(0f32, 1.0, shape, &Device::Cpu)?.to_dtype(dtype)?;
    let g = Tensor::randn(0f32, 1.0, shape, &Device::Cpu)?.to_dtype(dtype)?;
    let (y_gpu, dx_gpu) = dropped(&x, &g, gpu, step)?;
    let (y_cpu, dx_cpu) = dropped(&x, &g, &Device::Cpu, step)?;
    let diff = |a: &Tensor, b: &Tensor| -> Result<f64> {
        Ok((a - b)?
            .abs()?
            .max_all()?
            .to_dtype(DType::F64)?
            .to_scalar()?)
    };
    Ok(diff(&y_gpu, &y_cpu)?.max(diff(&dx_gpu, &dx_cpu)?))
}

/// The share of elements kept or dropped alike by two consecutive steps' masks on the device.
fn next_step_agreement(gpu: &Device) -> Result<f64> {
    let ones = Tensor::ones((4, 6, 5, 7), DType::F32, &Device::Cpu)?;
    let kept = |step| -> Result<Tensor> {
        let (y, _) = dropped(&ones, &ones, gpu, step)?;
        Ok(y.gt(0f64)?.to_dtype(DType::F32)?)
    };
    let (a, b) = (kept(STEP)?, kept(STEP + 1)?);
    let same = a
        .eq(&b)?
        .to_dtype(DType::F32)?
        .mean_all()?
        .to_scalar::<f32>()?;
    Ok(f64::from(same))
}

/// The relative L2 distance between the gradients of a bf16 GPT with dropout through its blocks'
/// own backward (every block: the attention's dropout inside cuDNN's fused attention) and
/// through Candle's graph of the same forward; infinity when a block fell back to the graph.
fn explicit_against_graph(gpu: &Device) -> Result<f64> {
    let mut config = GptConfig::from_name("gpt-tiny")?
        .with_seed(7)
        .with_dropout(0.1);
    (config.n_embd, config.n_head, config.context) = (128, 2, 64);
    let model = gpt(&config, DType::BF16, gpu)?;
    let vocab = config.vocab_size as u32;
    let ids: Vec<u32> = (0..4 * 64u32).map(|i| (i * 37 + i * i) % vocab).collect();
    let targets: Vec<u32> = ids.iter().map(|i| (i + 1) % vocab).collect();
    let ids = Tensor::from_vec(ids, (4, 64), gpu)?;
    let targets = Tensor::from_vec(targets, (4, 64), gpu)?;
    ops::set_dropout_step(gpu, 9)?;
    let mode = Mode::TRAIN.with_dropout_seed(3).with_dropout_step(9);
    let objective = NextToken {
        vocab_size: config.vocab_size,
    };
    let embedded = model.blocks()[0].forward(&ids, mode)?;
    for block in &model.blocks()[1..3] {
        let explicit = block
            .explicit()
            .and_then(|b| b.forward_saving(&embedded, mode).transpose());
        if explicit.is_none() {
            println!(
                "gpt-check: {} fell back to the graph with dropout",
                block.name()
            );
            return Ok(f64::INFINITY);
        }
    }
    let logits = model.forward(&ids, mode)?;
    let graph = objective.loss(&logits, &targets)?.loss.backward()?;
    let tape = tape::forward(&model, &ids, mode, &Checkpointing::None)?;
    let loss = objective.loss(tape.output(), &targets)?.loss;
    let (mut diff, mut norm) = (0f64, 0f64);
    let entries = model.store().entries();
    tape.backward(&loss, &model, |ready| {
        for (id, grad) in ready.grads {
            let reference = graph
                .get(entries[id].tensor())
                .expect("every parameter learns");
            let ours = grad.expect("every parameter learns").to_dtype(DType::F64)?;
            let reference = reference.to_dtype(DType::F64)?;
            diff += (&ours - &reference)?.sqr()?.sum_all()?.to_scalar::<f64>()?;
            norm += reference.sqr()?.sum_all()?.to_scalar::<f64>()?;
        }
        Ok::<(), weft_tensor::TensorError>(())
    })?;
    Ok((diff / norm).sqrt())
}

/// The largest relative difference between the step losses of `gpt-tiny` trained with dropout
/// from a CUDA graph (launched ahead) and eagerly; infinity when the graph run replayed fewer
/// than 4 of its 8 steps, or when dropout did not move its losses.
fn replayed_against_eager() -> Result<f64> {
    let out = std::env::temp_dir().join(format!("weft-gpu-check-dropout-{}", std::process::id()));
    let result = (|| {
        let replayed = train(&out, 0.1, true)?;
        let eager = step_losses(&train(&out, 0.1, false)?)?;
        let undropped = step_losses(&train(&out, 0.0, false)?)?;
        let (losses, launches) = (step_losses(&replayed)?, graph_launches(&replayed)?);
        println!("train-gpt --dropout 0.1: {launches} replays traced");
        let moved = (eager[2].1 - undropped[2].1).abs();
        if losses.len() != 8 || eager.len() != 8 || launches < 4 || moved < 1e-4 {
            return Ok(f64::INFINITY);
        }
        Ok(losses
            .iter()
            .zip(&eager)
            .map(|((_, a), (_, b))| ((a - b) / b).abs())
            .fold(0f64, f64::max))
    })();
    weft_tensor::ops::set_deterministic(false);
    let _ = std::fs::remove_dir_all(&out);
    result
}

/// One `--deterministic` bf16 run of 8 steps into `out`; its folder.
fn train(out: &Path, p: f64, cuda_graph: bool) -> Result<PathBuf> {
    let name = format!("dropout-{p}-graph-{cuda_graph}");
    tiny_gpt_run(out, &name, 8, |args| {
        args.training.deterministic = true;
        args.precision.precision = weft_train::flags::Precision::Bf16Mixed;
        args.model.dropout = p;
        args.parallel.cuda_graph = cuda_graph;
    })
}
