//! The optimizers' CUDA kernels against their CPU rules: the same 61 parameters (one of
//! 300 001 elements, so blocks stride), gradients and schedule stepped by `ModelOptimizer` on
//! the GPU (in place, multi-tensor launches) and on the CPU (the slice rule over a flat master
//! copy), with param groups cutting parameters in the middle. The kernels are compiled without
//! fused multiply-adds and compute their scalars in f64 as the CPU does, so the results agree
//! to the last bits (the bias corrections' `pow` may differ by an ulp in f64).

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_optim::{
    AdamWConfig, ModelOptimizer, OptimizerConfig, ParamGroup, ParamGroups, SgdConfig,
};
use weft_tensor::{EntryKind, FlatBuffer, FlatLayout, ParamStore};

use super::single_ops::{relative_error, MULTI_SIZES};
use super::Check;

const STEPS: usize = 5;

/// The rules compared, by row name.
pub(super) fn configs() -> Vec<(&'static str, OptimizerConfig)> {
    let sgd = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        weight_decay: 1e-2,
        ..SgdConfig::default()
    };
    let adamw = AdamWConfig {
        lr: 1e-2,
        weight_decay: 1e-2,
        ..AdamWConfig::default()
    };
    vec![
        (
            "SGD momentum, weight decay",
            OptimizerConfig::Sgd(sgd.clone()),
        ),
        (
            "SGD Nesterov, dampening 0",
            OptimizerConfig::Sgd(SgdConfig {
                nesterov: true,
                ..sgd.clone()
            }),
        ),
        (
            "SGD dampened, maximize, no momentum buffer",
            OptimizerConfig::Sgd(SgdConfig {
                momentum: 0.0,
                maximize: true,
                ..sgd
            }),
        ),
        ("AdamW", OptimizerConfig::AdamW(adamw.clone())),
        (
            "AdamW amsgrad",
            OptimizerConfig::AdamW(AdamWConfig {
                amsgrad: true,
                ..adamw
            }),
        ),
    ]
}

/// Parameters of `MULTI_SIZES` on `device`, with the same seeded values everywhere.
fn store(device: &Device, dtype: DType) -> Result<ParamStore> {
    let mut store = ParamStore::new(device, dtype);
    for (i, &n) in MULTI_SIZES.iter().enumerate() {
        let values: Vec<f64> = (0..n)
            .map(|k| (((k * 7919 + i * 104_729) % 2003) as f64 / 1001.5 - 1.0) * 0.5)
            .collect();
        let t = Tensor::from_vec(values, n, device)?.to_dtype(dtype)?;
        store.register(&format!("p{i}"), EntryKind::Parameter, t)?;
    }
    Ok(store)
}

/// Param groups cutting the flat buffer mid-parameter: no decay and half the rate.
fn groups(len: usize) -> Result<ParamGroups> {
    Ok(ParamGroups::new(vec![
        ParamGroup {
            range: 10..len / 3,
            weight_decay: 0.0,
            lr_scale: 0.5,
        },
        ParamGroup {
            range: len / 2..len / 2 + 777,
            weight_decay: 0.1,
            lr_scale: 2.0,
        },
    ])?)
}

/// `STEPS` steps of `config` on `device` for parameters of dtype `params` with gradients of
/// dtype `grads` (the same, or fp32 for 16-bit parameters: fp32 master weights, a flat master
/// copy on the CPU and the kernels' own on the GPU); returns the parameters after them (on
/// the CPU, as f64).
fn run(
    config: &OptimizerConfig,
    device: &Device,
    (params, grads): (DType, DType),
    in_parts: bool,
) -> Result<Tensor> {
    let store = store(device, params)?;
    let layout = FlatLayout::parameters(&store);
    let len = layout.len();
    let gradients = FlatBuffer::zeros(layout.clone(), grads, device)?;
    let master = layout.read_range(&store, 0..len, grads)?;
    let mut optimizer = ModelOptimizer::new(config.clone(), groups(len)?, device, grads)?;
    for step in 0..STEPS {
        let master = optimizer.needs_master_copy().then_some(&master);
        one_step(&mut optimizer, (&gradients, step), &store, master, in_parts)?;
    }
    flat_params(&store)
}

/// Step `step` of every run: its gradients and learning rate; `in_parts`: stepped as DDP's
/// held last bucket is, the second half first (cut mid-parameter), then the first.
fn one_step(
    optimizer: &mut ModelOptimizer,
    (gradients, step): (&FlatBuffer, usize),
    store: &ParamStore,
    master: Option<&Tensor>,
    in_parts: bool,
) -> Result<()> {
    let len = gradients.layout().len();
    let values: Vec<f64> = (0..len)
        .map(|k| ((k * 31 + step * 977) % 1999) as f64 / 999.5 - 1.0)
        .collect();
    let device = gradients.tensor().device();
    let g = Tensor::from_vec(values, len, device)?.to_dtype(gradients.dtype())?;
    gradients.tensor().slice_set(&g, 0, 0)?;
    optimizer.set_lr(0.1 / (1 + step) as f64)?;
    if !in_parts {
        optimizer.step(master, gradients, store, 0..len, None)?;
        return Ok(());
    }
    let cut = len / 2 + 5;
    let mut order = Vec::new();
    optimizer.step_in_parts(
        master,
        gradients,
        store,
        0..len,
        None,
        &[cut..len, 0..cut],
        |part| {
            order.push(part);
            anyhow::Ok(())
        },
    )?;
    anyhow::ensure!(order == [0, 1], "parts announced as {order:?}");
    Ok(())
}

/// The parameters of `store`, flattened, on the CPU as f64.
fn flat_params(store: &ParamStore) -> Result<Tensor> {
    let flat: Vec<Tensor> = store
        .parameter_ids()
        .into_iter()
        .map(|id| {
            store.entries()[id]
                .tensor()
                .flatten_all()?
                .to_dtype(DType::F64)
        })
        .collect::<candle_core::Result<_>>()?;
    Ok(Tensor::cat(&flat, 0)?.to_device(&Device::Cpu)?)
}

/// Mixed-precision steps on the GPU (16-bit parameters of `dtype`, fp32 gradients and master
/// weights kept by the kernels) resumed halfway from the optimizer's saved state, its master
/// weights included, against the same steps without the break: the largest relative
/// difference of the parameters (0 when the master weights survive the round trip; a master
/// rebuilt from the 16-bit parameters would differ).
pub(super) fn compare_resumed(config: &OptimizerConfig, gpu: &Device, dtype: DType) -> Result<f64> {
    let go = |resume: bool| -> Result<Tensor> {
        let store = store(gpu, dtype)?;
        let len = FlatLayout::parameters(&store).len();
        let gradients = FlatBuffer::zeros(FlatLayout::parameters(&store), DType::F32, gpu)?;
        let fresh = || -> Result<ModelOptimizer> {
            Ok(ModelOptimizer::new(
                config.clone(),
                groups(len)?,
                gpu,
                DType::F32,
            )?)
        };
        let mut optimizer = fresh()?;
        for step in 0..STEPS {
            if resume && step == STEPS / 2 {
                let saved = optimizer.flat_state(len)?;
                optimizer = fresh()?;
                optimizer.load_flat_state(&saved.optimizer, saved.step, 0..len, saved.buffers)?;
            }
            one_step(&mut optimizer, (&gradients, step), &store, None, false)?;
        }
        flat_params(&store)
    };
    relative_error(&go(false)?, &go(true)?)
}

/// The largest relative difference of the parameters after `STEPS` steps on the GPU and on
/// the CPU.
pub(super) fn compare_optimizer(
    config: &OptimizerConfig,
    gpu: &Device,
    dtype: DType,
) -> Result<f64> {
    let cpu = run(config, &Device::Cpu, (dtype, dtype), false)?;
    let on_gpu = run(config, gpu, (dtype, dtype), false)?;
    relative_error(&cpu, &on_gpu)
}

/// The largest relative difference of the 16-bit parameters (`dtype`) after `STEPS`
/// mixed-precision steps on the GPU (master-weight kernels) and on the CPU (fp32 master copy,
/// rounded back).
pub(super) fn compare_mixed(config: &OptimizerConfig, gpu: &Device, dtype: DType) -> Result<f64> {
    let cpu = run(config, &Device::Cpu, (dtype, DType::F32), false)?;
    let on_gpu = run(config, gpu, (dtype, DType::F32), false)?;
    relative_error(&cpu, &on_gpu)
}

/// The largest relative difference of the parameters after `STEPS` steps on the GPU, each
/// in one launch sequence and each in two parts (DDP's held last bucket), with parameters of
/// `params` and gradients of `grads`: 0, every rule being element-wise.
pub(super) fn compare_in_parts(
    config: &OptimizerConfig,
    gpu: &Device,
    dtypes: (DType, DType),
) -> Result<f64> {
    let whole = run(config, gpu, dtypes, false)?;
    let in_parts = run(config, gpu, dtypes, true)?;
    relative_error(&whole, &in_parts)
}

/// Pushes the optimizer rows onto `checks`: each rule against the CPU in f32 and f64, with fp32
/// master weights of 16-bit parameters, stepped in two parts, and resumed from its state.
pub(super) fn rows(gpu: &Device, checks: &mut Vec<Check>) -> Result<()> {
    // The same operations in the same order without fused multiply-adds: f32 bit-equal but
    // for an ulp of the bias corrections; f64 likewise.
    for (dtype, tolerance) in [(DType::F32, 1e-6), (DType::F64, 1e-13)] {
        for (name, config) in configs() {
            checks.push(Check {
                name: format!("optimizer {name}, 61 tensors, groups, 5 steps, {dtype:?}"),
                error: compare_optimizer(&config, gpu, dtype)?,
                tolerance,
            });
        }
    }
    // fp32 master weights of 16-bit parameters: the same fp32 rule, rounded to nearest even
    // on both sides.
    for dtype in [DType::BF16, DType::F16] {
        for (name, config) in configs() {
            checks.push(Check {
                name: format!("optimizer {name}, fp32 masters of {dtype:?} parameters"),
                error: compare_mixed(&config, gpu, dtype)?,
                tolerance: 0.0,
            });
        }
    }
    // Stepped in two parts, as under DDP's held last bucket: the same bits.
    for dtypes in [(DType::F32, DType::F32), (DType::BF16, DType::F32)] {
        for (name, config) in configs() {
            checks.push(Check {
                name: format!("optimizer {name}, {dtypes:?}, stepped in two parts = in one"),
                error: compare_in_parts(&config, gpu, dtypes)?,
                tolerance: 0.0,
            });
        }
    }
    // A checkpoint of the optimizer keeps its fp32 master weights: resuming changes nothing.
    for (name, config) in configs() {
        checks.push(Check {
            name: format!("optimizer {name}, bf16 params, resumed from its state"),
            error: compare_resumed(&config, gpu, DType::BF16)?,
            tolerance: 0.0,
        });
    }
    Ok(())
}
