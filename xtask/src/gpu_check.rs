//! `cargo xtask gpu-check`: the CUDA path against the CPU reference, as a pass/fail table.
//! Each op's forward output and input/parameter gradients on the GPU are compared with the same
//! computation on the CPU (fresh random inputs, f32, relative error to the largest value): the
//! convolutions, weft's kernels (batch norm, ReLU, max-pool) and the Candle ops that other
//! dtypes fall back to. Then ResNet-50 is compared in f64: whole-graph gradients, the block-wise trainer's gradients and
//! parameters after one SGD step, and the losses of three steps. (In f32 a ResNet-50 at batch 4
//! is too ill-conditioned to compare: BatchNorm over 16 values per channel in the last stage
//! makes even the CPU's f32 and f64 gradients differ by 28 %.) Run it on a GPU machine whenever
//! GPU code changes and record the table in `docs/gpu-checks.md`.

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor, Var};
use weft_models::{resnet, ResNetConfig};
use weft_optim::{Sgd, SgdConfig, TensorSgd};
use weft_tensor::{ops, Checkpointing};
use weft_train::step::{FlatOptimizer, Trainer};

/// A convolution to check: name, input shape, weight shape, stride, padding.
type ConvCase = (&'static str, [usize; 4], [usize; 4], usize, usize);

/// One row of the table.
struct Check {
    name: &'static str,
    error: f64,
    tolerance: f64,
}

pub fn run() -> Result<()> {
    let gpu = Device::new_cuda(0)?;
    #[cfg(feature = "cuda")]
    weft_tensor::cuda_runtime::configure(&gpu, Default::default())?;
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
            name,
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
            name,
            error,
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
            name,
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
            name,
            error: compare_graph_free_batch_norm(&gpu, dims, relu)?,
            tolerance: 1e-3,
        });
    }
    checks.push(Check {
        name: "blend_into (running statistics)",
        error: compare_blend(&gpu)?,
        tolerance: 1e-6,
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
            name,
            error: compare_op(&gpu, shapes, f)?,
            tolerance,
        });
    }
    ops::set_cuda_kernels(true);
    checks.push(Check {
        name: "ResNet-50 f64 whole-graph grads",
        error: compare_whole_graph(&gpu)?,
        tolerance: 1e-6,
    });
    let (grad_error, param_error, loss_error) = compare_training(&gpu)?;
    checks.push(Check {
        name: "ResNet-50 f64 step 1 gradients",
        error: grad_error,
        tolerance: 1e-6,
    });
    checks.push(Check {
        name: "ResNet-50 f64 step 1 parameters",
        error: param_error,
        tolerance: 1e-8,
    });
    checks.push(Check {
        name: "ResNet-50 f64 3 SGD steps, loss",
        error: loss_error,
        tolerance: 1e-6,
    });

    println!(
        "{:<36} {:>12} {:>10}  result",
        "check", "rel. error", "tolerance"
    );
    let mut failed = 0;
    for c in &checks {
        let pass = c.error <= c.tolerance;
        failed += usize::from(!pass);
        println!(
            "{:<36} {:>12.3e} {:>10.0e}  {}",
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

/// Max relative error (over the output and the gradients of every input) between `f` on the
/// GPU and on the CPU, for random inputs of the given shapes and a random output weighting.
fn compare_op(
    gpu: &Device,
    shapes: &[&[usize]],
    f: impl Fn(&[Tensor]) -> candle_core::Result<Tensor>,
) -> Result<f64> {
    let inputs: Vec<Tensor> = shapes
        .iter()
        .map(|s| Tensor::randn(0f32, 1.0, *s, &Device::Cpu))
        .collect::<candle_core::Result<_>>()?;
    let run = |device: &Device, weight: Option<&Tensor>| -> Result<(Vec<Tensor>, Tensor)> {
        let vars: Vec<Var> = inputs
            .iter()
            .map(|t| Var::from_tensor(&t.to_device(device)?))
            .collect::<candle_core::Result<_>>()?;
        let tensors: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
        let out = f(&tensors)?;
        let weight = match weight {
            Some(w) => w.to_device(device)?,
            None => Tensor::randn(0f32, 1.0, out.shape(), device)?,
        };
        let grads = (&out * &weight)?.sum_all()?.backward()?;
        let mut results = vec![out.to_device(&Device::Cpu)?];
        for v in &vars {
            results.push(
                grads
                    .get(v)
                    .expect("every input takes part")
                    .to_device(&Device::Cpu)?,
            );
        }
        Ok((results, weight.to_device(&Device::Cpu)?))
    };
    let (cpu, weight) = run(&Device::Cpu, None)?;
    let (on_gpu, _) = run(gpu, Some(&weight))?;
    cpu.iter()
        .zip(&on_gpu)
        .map(|(a, b)| relative_error(a, b))
        .try_fold(0f64, |m, e| Ok(m.max(e?)))
}

/// `batch_norm_train_forward` and `_backward` on the GPU against the CPU: output, statistics
/// table and every gradient, for random inputs.
fn compare_graph_free_batch_norm(gpu: &Device, dims: [usize; 4], relu: bool) -> Result<f64> {
    let c = dims[1];
    let cpu_inputs = [
        Tensor::randn(0f32, 1.0, &dims[..], &Device::Cpu)?,
        Tensor::randn(1f32, 0.5, c, &Device::Cpu)?,
        Tensor::randn(0f32, 0.5, c, &Device::Cpu)?,
        Tensor::randn(0f32, 1.0, &dims[..], &Device::Cpu)?,
    ];
    let run = |device: &Device| -> Result<Vec<Tensor>> {
        let t: Vec<Tensor> = cpu_inputs
            .iter()
            .map(|t| t.to_device(device))
            .collect::<candle_core::Result<_>>()?;
        let out = ops::batch_norm_train_forward(&t[0], &t[1], &t[2], 1e-5, relu)?;
        let relu_output = relu.then_some(&out.y);
        let g = ops::batch_norm_train_backward(&t[0], &out.table, relu_output, &t[3], 1e-5, true)?;
        let dx = g.x.expect("asked for");
        [out.y, out.table, dx, g.weight, g.bias]
            .iter()
            .map(|t| Ok(t.to_device(&Device::Cpu)?))
            .collect()
    };
    let (cpu, on_gpu) = (run(&Device::Cpu)?, run(gpu)?);
    cpu.iter()
        .zip(&on_gpu)
        .map(|(a, b)| relative_error(a, b))
        .try_fold(0f64, |m, e| Ok(m.max(e?)))
}

/// `blend_into` on the GPU against the CPU, from a row of a statistics table.
fn compare_blend(gpu: &Device) -> Result<f64> {
    let running = Tensor::randn(0f32, 1.0, 300, &Device::Cpu)?;
    let table = Tensor::randn(0f32, 1.0, (2, 300), &Device::Cpu)?;
    let run = |device: &Device| -> Result<Tensor> {
        let r = running.to_device(device)?.copy()?;
        ops::blend_into(&r, &table.to_device(device)?.get(1)?, 0.1, 1.01)?;
        Ok(r.to_device(&Device::Cpu)?)
    };
    relative_error(&run(&Device::Cpu)?, &run(gpu)?)
}

fn relative_error(reference: &Tensor, other: &Tensor) -> Result<f64> {
    let a: Vec<f64> = reference.flatten_all()?.to_dtype(DType::F64)?.to_vec1()?;
    let b: Vec<f64> = other.flatten_all()?.to_dtype(DType::F64)?.to_vec1()?;
    let scale = a.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    Ok(a.iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()))
        / scale)
}

/// CPU against GPU on ResNet-50 in f64 (same initialisation, same batch of 4 images at 64x64):
/// the flat gradients and the parameters after the first SGD step, and the losses of 3 steps.
/// The CPU steps with the slice SGD, the GPU with the tensor SGD the trainer uses there.
fn compare_training(gpu: &Device) -> Result<(f64, f64, f64)> {
    let images = Tensor::randn(0f32, 1.0, (4, 3, 64, 64), &Device::Cpu)?;
    let labels = Tensor::new(&[1u32, 7, 3, 9], &Device::Cpu)?;
    let run = |device: &Device| -> Result<(Tensor, Tensor, Vec<f64>)> {
        let model = resnet(
            &ResNetConfig::from_name("resnet50", 10)?,
            DType::F64,
            device,
        )?;
        let config = SgdConfig {
            lr: 0.01,
            momentum: 0.9,
            weight_decay: 1e-4,
            ..SgdConfig::default()
        };
        let optimizer = if device.is_cpu() {
            FlatOptimizer::F64(Box::new(Sgd::<f64>::new(config)?))
        } else {
            FlatOptimizer::Tensor(TensorSgd::new(config)?)
        };
        let mut trainer = Trainer::new(model, optimizer, Checkpointing::None)?;
        let (x, y) = (
            images.to_dtype(DType::F64)?.to_device(device)?,
            labels.to_device(device)?,
        );
        let mut losses = vec![trainer.step(&x, &y, 0.01)?.loss];
        let grads = trainer.grads().tensor().to_device(&Device::Cpu)?.copy()?;
        let store = trainer.model().store();
        let params: Vec<Tensor> = store
            .parameter_ids()
            .into_iter()
            .map(|id| {
                store.entries()[id]
                    .tensor()
                    .flatten_all()?
                    .to_device(&Device::Cpu)
            })
            .collect::<candle_core::Result<_>>()?;
        let params = Tensor::cat(&params, 0)?;
        for _ in 0..2 {
            losses.push(trainer.step(&x, &y, 0.01)?.loss);
        }
        Ok((grads, params, losses))
    };
    let (cpu_grads, cpu_params, cpu) = run(&Device::Cpu)?;
    let (gpu_grads, gpu_params, on_gpu) = run(gpu)?;
    let model = resnet(
        &ResNetConfig::from_name("resnet50", 10)?,
        DType::F32,
        &Device::Cpu,
    )?;
    let mut worst: Vec<(f64, String)> = weft_tensor::FlatLayout::parameters(model.store())
        .slots()
        .iter()
        .map(|slot| {
            let part = |t: &Tensor| t.narrow(0, slot.offset, slot.numel());
            Ok((
                relative_error(&part(&cpu_grads)?, &part(&gpu_grads)?)?,
                slot.name.clone(),
            ))
        })
        .collect::<Result<_>>()?;
    worst.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!(
        "largest per-parameter gradient differences: {:?}",
        &worst[..6]
    );
    println!("ResNet-50 losses, CPU {cpu:?}, GPU {on_gpu:?}");
    let loss_error = cpu
        .iter()
        .zip(&on_gpu)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs() / a.abs().max(1e-12)));
    Ok((
        relative_error(&cpu_grads, &gpu_grads)?,
        relative_error(&cpu_params, &gpu_params)?,
        loss_error,
    ))
}

/// One whole-graph `backward()` of ResNet-50 (no block-wise tape) on the CPU and on the GPU:
/// the largest per-parameter relative gradient difference (the worst six are printed).
fn compare_whole_graph(gpu: &Device) -> Result<f64> {
    let images = Tensor::randn(0f32, 1.0, (4, 3, 64, 64), &Device::Cpu)?;
    let labels = Tensor::new(&[1u32, 7, 3, 9], &Device::Cpu)?;
    let grads = |device: &Device| -> Result<Vec<(String, Tensor)>> {
        let model = resnet(
            &ResNetConfig::from_name("resnet50", 10)?,
            DType::F64,
            device,
        )?;
        let logits = model.forward(
            &images.to_dtype(DType::F64)?.to_device(device)?,
            weft_tensor::Mode::TRAIN,
        )?;
        let g =
            weft_models::loss::cross_entropy(&logits, &labels.to_device(device)?)?.backward()?;
        let store = model.store();
        store
            .parameter_ids()
            .into_iter()
            .map(|id| {
                let e = &store.entries()[id];
                Ok((
                    e.name.clone(),
                    g.get(e.tensor()).expect("used").to_device(&Device::Cpu)?,
                ))
            })
            .collect()
    };
    let (cpu, on_gpu) = (grads(&Device::Cpu)?, grads(gpu)?);
    let mut worst: Vec<(f64, String)> = cpu
        .iter()
        .zip(&on_gpu)
        .map(|((n, a), (_, b))| Ok((relative_error(a, b)?, n.clone())))
        .collect::<Result<_>>()?;
    worst.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!(
        "whole graph, largest per-parameter gradient differences: {:?}",
        &worst[..6]
    );
    Ok(worst[0].0)
}
