//! Channels-last tensors on the GPU (cuDNN's NHWC plans on the tensors' own storage, the NHWC
//! batch-norm kernels, the residual gradient added in place into a channels-last tensor)
//! against the CPU computing the same block in NCHW; and a ResNet-18 training step with
//! channels-last blocks against the NCHW network on the same GPU.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_models::loss::Classification;
use weft_models::{resnet, ResNetConfig};
use weft_precision::PrecisionPolicy;
use weft_tensor::ops;
use weft_tensor::ops::BatchStats::Local;
use weft_train::optim_setup::OptimizerSettings;
use weft_train::step_engine::{self, StepSettings};

use super::half::{graph_free_conv_in, STEM};
use super::pool_special::{pooled_four_ways, POOL_CASES};
use super::single_ops::{compare_graph_free_batch_norm, relative_error};
use super::Check;

/// Seeded draws of the block's inputs.
const SEEDS: u64 = 8;

/// Adds the channels-last rows to `checks`.
pub(super) fn run(gpu: &Device, checks: &mut Vec<Check>) -> Result<()> {
    // As accurate as the same block on NCHW tensors on the GPU: through a convolution, a
    // batch norm and back, the CPU's and the GPU's roundings (of 16-bit outputs especially)
    // are amplified alike, so the NCHW block's error (at least 1e-3 in f32 with TF32 off, as
    // the convolution rows, and 4 rounding units in bf16) sets the bound, doubled. The inputs
    // are drawn from seeded generators, the worst of several draws counts (one unseeded draw
    // once gave 5.9e-2 in bf16 against a 1.6e-2 bound, and passed twice after).
    for (dtype, floor) in [(DType::F32, 1e-3), (DType::BF16, 4.0 * 2f64.powi(-8))] {
        let (mut error, mut nchw) = (0f64, 0f64);
        for seed in 0..SEEDS {
            let (e, n) = block(gpu, dtype, seed)?;
            (error, nchw) = (error.max(e), nchw.max(n));
        }
        println!("channels-last block {dtype:?}: {error:.3e} (NCHW on the GPU: {nchw:.3e})");
        checks.push(Check {
            name: format!("channels-last conv + BN + ReLU block, {dtype:?}"),
            error,
            tolerance: floor.max(2.0 * nchw),
        });
    }
    // The NHWC batch-norm kernels alone, the backward with the ReLU's mask recomputed inside:
    // 16-byte vectors of channels (256 channels), one channel a thread (6 channels, which do
    // not fill a vector), and the reductions split over blocks (56x56). f32 against the CPU,
    // the bound of the NCHW rows of the same op.
    for (name, dims, relu) in [
        ("@7 + ReLU (256 ch)", [8, 256, 7, 7], true),
        ("@9 + ReLU (6 ch, one channel a thread)", [4, 6, 9, 9], true),
        ("@56 (split)", [8, 64, 56, 56], false),
    ] {
        checks.push(Check {
            name: format!("channels-last graph-free batch norm {name}"),
            error: compare_graph_free_batch_norm(gpu, dims, (relu, true), DType::F32)?,
            tolerance: 1e-3,
        });
    }
    // The stem's convolution on the channels-last path, f32 (TF32 off; bf16 runs it lowered
    // by space-to-depth, f32 as it is): the bound of the convolution rows.
    checks.push(Check {
        name: "channels-last graph-free conv2d stem 7x7/2, F32".into(),
        error: graph_free_conv_in(gpu, DType::F32, STEM, true)?,
        tolerance: 1e-3,
    });
    // Max-pool on NHWC storage and the ReLU kernels' vector and element paths: the same
    // comparisons and the same order of additions as the CPU, so equal up to the last bit
    // (1e-6 as the NCHW max-pool rows).
    for dtype in [DType::F32, DType::BF16] {
        // 24 channels take the vector kernels, 6 the per-channel ones.
        for channels in [24, 6] {
            checks.push(Check {
                name: format!(
                    "channels-last max_pool2d with ties, forward and backward, {channels} ch, {dtype:?}"
                ),
                error: pool_nhwc(gpu, dtype, channels)?,
                tolerance: 1e-6,
            });
        }
        // The fused end of a residual block computes what the two passes compute, rounding
        // for rounding.
        for channels in [24, 6] {
            checks.push(Check {
                name: format!(
                    "channels-last batch norm + add + ReLU = two passes, {channels} ch, {dtype:?}"
                ),
                error: bn_add_relu(gpu, dtype, channels)?,
                tolerance: 0.0,
            });
        }
        checks.push(Check {
            name: format!("channels-last batch norm in inference (+ ReLU), {dtype:?}"),
            error: bn_eval(gpu, dtype)?,
            // The same f32 arithmetic on both sides, up to fused multiply-adds: a last-bit
            // difference, one unit once rounded to bf16.
            tolerance: match dtype {
                DType::BF16 => 2f64.powi(-8),
                _ => 1e-6,
            },
        });
        checks.push(Check {
            name: format!("relu_backward and add_relu on unaligned views, {dtype:?}"),
            error: relu_on_views(gpu, dtype)?,
            tolerance: 1e-6,
        });
    }
    let (loss, grads) = resnet18_step(gpu)?;
    checks.push(Check {
        name: "ResNet-18 f32 channels-last = NCHW, loss".into(),
        error: loss,
        tolerance: 1e-5,
    });
    // f32 sums in other orders (NHWC against NCHW algorithms), amplified by batch norms over
    // 64 values per channel in the last stage.
    checks.push(Check {
        name: "ResNet-18 f32 channels-last = NCHW, gradients".into(),
        error: grads,
        tolerance: 1e-2,
    });
    Ok(())
}

/// `max_pool2d_forward` and `max_pool2d_backward` (3x3, stride 2, padding 1 on 15 x 15 and
/// 16 x 16 images: the backward a thread per 2 x 2 cell, edge cells cut; 3x3, stride 1 on
/// 16 x 16: a thread per pixel) of a ReLU's output (ties at zero) on channels-last GPU tensors,
/// whose results must stay channels-last, against the CPU on NCHW, and the same through
/// `max_pool2d_forward_saving` and `max_pool2d_backward_saved`: the largest relative error of
/// `y` and `dx` (infinite if the layout is lost, or if the GPU did not keep the first maxima as
/// bytes).
fn pool_nhwc(gpu: &Device, dtype: DType, channels: usize) -> Result<f64> {
    let mut error = 0f64;
    for case in POOL_CASES {
        error = error.max(pool_nhwc_window(gpu, dtype, channels, case)?);
    }
    Ok(error)
}

/// [`pool_nhwc`] for one image size and stride (3 x 3 windows, padding 1).
fn pool_nhwc_window(
    gpu: &Device,
    dtype: DType,
    channels: usize,
    (size, stride): (usize, usize),
) -> Result<f64> {
    let cpu = Device::Cpu;
    let x = Tensor::randn(0f32, 1.0, (4, channels, size, size), &cpu)?
        .relu()?
        .to_dtype(dtype)?;
    let out = (size + 2 - 3) / stride + 1;
    let dy = Tensor::randn(0f32, 1.0, (4, channels, out, out), &cpu)?.to_dtype(dtype)?;
    let (expected, _) = pooled_four_ways(&cpu, &x, &dy, stride)?;
    let (got, kept) = pooled_four_ways(gpu, &x, &dy, stride)?;
    let both = |r: &[Tensor], a: usize| -> Result<Tensor> {
        Ok(Tensor::cat(
            &[r[a].flatten_all()?, r[a + 2].flatten_all()?],
            0,
        )?)
    };
    match kept {
        true => Ok(relative_error(&both(&expected, 0)?, &both(&got, 0)?)?
            .max(relative_error(&both(&expected, 1)?, &both(&got, 1)?)?)),
        false => Ok(f64::INFINITY),
    }
}

/// `batch_norm_eval` with and without its ReLU on channels-last GPU tensors (24 channels)
/// against the CPU on NCHW: the largest relative error, or infinity if the layout is lost.
fn bn_eval(gpu: &Device, dtype: DType) -> Result<f64> {
    let cpu = Device::Cpu;
    let x = Tensor::randn(0.5f32, 2.0, (4, 24, 9, 9), &cpu)?.to_dtype(dtype)?;
    let per_channel = |mean: f32, std: f32| -> Result<Tensor> {
        Ok(Tensor::randn(mean, std, 24, &cpu)?.to_dtype(dtype)?)
    };
    let (mean, weight, bias) = (
        per_channel(0.5, 1.0)?,
        per_channel(1.0, 0.3)?,
        per_channel(0.0, 0.5)?,
    );
    let var = per_channel(0.0, 1.0)?.sqr()?.affine(1.0, 0.5)?;
    let run = |device: &Device| -> Result<(Tensor, bool)> {
        let on = |t: &Tensor| t.to_device(device);
        let x = match device.is_cuda() {
            true => ops::to_channels_last(&on(&x)?)?,
            false => x.clone(),
        };
        let (mean, var, weight, bias) = (on(&mean)?, on(&var)?, on(&weight)?, on(&bias)?);
        let stats = || ops::EvalStats {
            running_mean: &mean,
            running_var: &var,
            weight: &weight,
            bias: &bias,
        };
        let y = ops::batch_norm_eval(&x, stats(), 1e-5, false)?;
        let relu = ops::batch_norm_eval(&x, stats(), 1e-5, true)?;
        let kept = ops::is_channels_last(&y) && ops::is_channels_last(&relu);
        let both = Tensor::cat(&[y.flatten_all()?, relu.flatten_all()?], 0)?;
        Ok((both.to_device(&Device::Cpu)?, kept))
    };
    let ((cpu_out, _), (gpu_out, kept)) = (run(&cpu)?, run(gpu)?);
    match kept {
        true => relative_error(&cpu_out, &gpu_out),
        false => Ok(f64::INFINITY),
    }
}

/// `batch_norm_train_forward_add_relu` on channels-last GPU tensors of `channels` channels
/// against `batch_norm_train_forward` then `add_relu_forward` on the same tensors: the largest
/// relative difference of the outputs and the tables.
fn bn_add_relu(gpu: &Device, dtype: DType, channels: usize) -> Result<f64> {
    let shape = (4, channels, 9, 9);
    let draw = |shape: &[usize], mean: f32| -> Result<Tensor> {
        Ok(Tensor::randn(mean, 1.0, shape, gpu)?.to_dtype(dtype)?)
    };
    let (x, residual) = (
        ops::to_channels_last(&draw(&[4, channels, 9, 9], 0.0)?)?,
        ops::to_channels_last(&draw(&[4, channels, 9, 9], 0.0)?)?,
    );
    let (weight, bias) = (draw(&[channels], 1.0)?, draw(&[channels], 0.0)?);
    let fused = ops::batch_norm_train_forward_add_relu(&x, &weight, &bias, 1e-5, &residual, Local)?;
    let plain = ops::batch_norm_train_forward(&x, &weight, &bias, 1e-5, false, Local)?;
    let two_pass = ops::add_relu_forward(&plain.y, &residual)?;
    if !ops::is_channels_last(&fused.y) || fused.y.dims() != [shape.0, shape.1, shape.2, shape.3] {
        return Ok(f64::INFINITY);
    }
    Ok(relative_error(&two_pass, &fused.y)?.max(relative_error(&plain.table, &fused.table)?))
}

/// `relu_backward` and `add_relu_forward` on views that start one element into their buffers
/// (odd plane sizes: not 16-byte aligned, so the kernels take their element path) and on whole
/// buffers (the vector path with a ragged tail), GPU against CPU.
fn relu_on_views(gpu: &Device, dtype: DType) -> Result<f64> {
    let cpu = Device::Cpu;
    let a = Tensor::randn(0f32, 1.0, (5, 3, 5, 7), &cpu)?.to_dtype(dtype)?;
    let b = Tensor::randn(0f32, 1.0, (5, 3, 5, 7), &cpu)?.to_dtype(dtype)?;
    let run = |device: &Device| -> Result<Vec<Tensor>> {
        let (a, b) = (a.to_device(device)?, b.to_device(device)?);
        let mut out = Vec::new();
        for (a, b) in [(a.narrow(0, 1, 3)?, b.narrow(0, 1, 3)?), (a, b)] {
            let y = ops::add_relu_forward(&a, &b)?;
            out.push(ops::relu_backward(&y, &b)?.to_device(&cpu)?);
            out.push(y.to_device(&cpu)?);
        }
        Ok(out)
    };
    let (reference, on_gpu) = (run(&cpu)?, run(gpu)?);
    reference
        .iter()
        .zip(&on_gpu)
        .try_fold(0f64, |m, (r, g)| Ok(m.max(relative_error(r, g)?)))
}

/// A convolution, a batch norm with ReLU and their backward (the input gradient added into a
/// residual gradient): on the GPU on channels-last tensors, whose results must stay
/// channels-last, against the CPU in NCHW; and, for the bound, the GPU on NCHW tensors
/// against the CPU. The inputs are drawn on the GPU from a generator seeded with `seed`.
fn block(gpu: &Device, dtype: DType, seed: u64) -> Result<(f64, f64)> {
    let cpu = Device::Cpu;
    gpu.set_seed(seed)?;
    let inputs: Vec<Tensor> = [
        (&[8, 64, 14, 14][..], 1.0),
        (&[128, 64, 3, 3], 0.05),
        (&[128], 0.2),
        (&[128], 0.2),
        (&[8, 128, 14, 14], 1.0),
        (&[8, 64, 14, 14], 1.0),
    ]
    .iter()
    .map(|&(shape, std)| {
        Tensor::randn(0f32, std, shape, gpu)?
            .to_device(&cpu)?
            .to_dtype(dtype)
    })
    .collect::<candle_core::Result<_>>()?;
    let run = |device: &Device, channels_last: bool| -> Result<(Vec<Tensor>, bool)> {
        let put = |t: &Tensor| -> Result<Tensor> {
            let t = t.to_device(device)?.copy()?;
            Ok(match channels_last && t.rank() == 4 {
                true => ops::to_channels_last(&t)?,
                false => t,
            })
        };
        let (x, w, dy, acc) = (
            put(&inputs[0])?,
            put(&inputs[1])?,
            put(&inputs[4])?,
            put(&inputs[5])?,
        );
        let gamma = (inputs[2].to_device(device)? + 1.0)?;
        let beta = inputs[3].to_device(device)?;
        let z = ops::conv2d_forward(&x, &w, 1, 1)?;
        let out = ops::batch_norm_train_forward(&z, &gamma, &beta, 1e-5, true, Local)?;
        let g =
            ops::batch_norm_train_backward(&z, &out.table, Some(&out.y), &dy, 1e-5, true, Local)?;
        let dz = g.x.expect("asked for");
        let dw = ops::conv2d_backward_add(&acc, &x, &w, &dz, 1, 1)?;
        let kept = [&z, &out.y, &dz, &acc]
            .iter()
            .all(|t| ops::is_channels_last(t) == channels_last);
        let results = [out.y, out.table, dz, acc, dw, g.weight, g.bias]
            .iter()
            .map(|t| Ok(t.to_device(&cpu)?))
            .collect::<Result<Vec<_>>>()?;
        Ok((results, kept))
    };
    let worst = |a: &[Tensor], b: &[Tensor]| -> Result<f64> {
        a.iter()
            .zip(b)
            .try_fold(0f64, |m, (a, b)| Ok(m.max(relative_error(a, b)?)))
    };
    let (reference, _) = run(&cpu, false)?;
    let (nchw, _) = run(gpu, false)?;
    let (on_gpu, kept) = run(gpu, true)?;
    let error = match kept {
        true => worst(&reference, &on_gpu)?,
        false => f64::INFINITY,
    };
    Ok((error, worst(&reference, &nchw)?))
}

/// One SGD step of ResNet-18 (f32, 16 images of 64x64) on the GPU with NCHW and with
/// channels-last blocks: the relative differences of the loss and of the flat gradients.
fn resnet18_step(gpu: &Device) -> Result<(f64, f64)> {
    let images = Tensor::randn(0f32, 1.0, (16, 3, 64, 64), gpu)?;
    let labels = Tensor::new(&[1u32, 7, 3, 9, 0, 2, 4, 6, 8, 5, 1, 3, 5, 7, 9, 0], gpu)?;
    let step = |channels_last: bool| -> Result<(f64, Tensor)> {
        let config = ResNetConfig::from_name("resnet18", 10)?.with_channels_last(channels_last);
        let model = resnet(&config, DType::F32, gpu)?;
        let sgd = OptimizerSettings::sgd(0.01, 0.0, 0.0);
        let step = StepSettings::new(sgd, PrecisionPolicy::from_name("fp32")?);
        let mut trainer = step_engine::assemble(model, Box::new(Classification), &step)?;
        let loss = trainer.step(&images, &labels, 0.01)?.loss;
        Ok((
            loss,
            trainer.grads().tensor().to_device(&Device::Cpu)?.copy()?,
        ))
    };
    let (loss, grads) = step(false)?;
    let (cl_loss, cl_grads) = step(true)?;
    Ok((
        (loss - cl_loss).abs() / loss.abs(),
        relative_error(&grads, &cl_grads)?,
    ))
}
