//! ResNet-50 in f64 on the GPU against the CPU: whole-graph gradients, and the trainer's
//! gradients, parameters and losses over SGD steps.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_models::loss::Classification;
use weft_models::{resnet, ResNetConfig};
use weft_optim::ModelOptimizer;
use weft_optim::{OptimizerConfig, ParamGroups, SgdConfig};
use weft_parallel::Trainer;
use weft_precision::{DynamicLossScaler, LossScalerState, ScalerConfig};
use weft_tensor::{ops, Checkpointing};

use super::single_ops::relative_error;

/// CPU against GPU on ResNet-50 in f64 (same initialisation, same batch of 4 images at 64x64):
/// the flat gradients and the parameters after the first SGD step, and the losses of 3 steps.
/// The CPU steps with the slice SGD, the GPU with the tensor SGD the trainer uses there.
pub(super) fn compare_training(gpu: &Device) -> Result<(f64, f64, f64)> {
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
        let config = OptimizerConfig::Sgd(config);
        let optimizer = ModelOptimizer::new(config, ParamGroups::default(), device, DType::F64)?;
        let mut trainer = Trainer::new(
            model,
            Box::new(Classification),
            optimizer,
            Checkpointing::None,
        )?;
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

/// The losses of 3 SGD steps of ResNet-50 in f32 (the trainer's default precision, TF32 off)
/// on the GPU and on the CPU, each against the same steps in f64 on the CPU from the same
/// initial values. The first loss (no update yet) must agree to 1e-5; over all steps the GPU's
/// largest relative error is held to four times the CPU's own f32 error (at least 1e-4): from
/// random initialisation a few steps of f32 training
/// amplify rounding strongly (8 images of 64x64 gave a 7 % difference between the CPU's and
/// the GPU's third loss while the f64 rows agree to 1e-12), so the check asks that the GPU be
/// as accurate as the CPU in the same precision, not that the two agree.
pub(super) fn compare_f32_losses(gpu: &Device) -> Result<F32Losses> {
    // Fixed images (a pattern, not a fresh random draw): the row compares the same trajectory
    // in every call.
    let pixels: Vec<f32> = (0..16 * 3 * 128 * 128)
        .map(|i| ((i as f32) * 0.618_034).sin() * 1.5)
        .collect();
    let images = Tensor::from_vec(pixels, (16, 3, 128, 128), &Device::Cpu)?;
    let labels = Tensor::from_vec(
        (0..16u32).map(|i| (i * 7) % 10).collect::<Vec<_>>(),
        16,
        &Device::Cpu,
    )?;
    let config = ResNetConfig::from_name("resnet50", 10)?;
    let initial = resnet(&config, DType::F32, &Device::Cpu)?;
    let run = |dtype: DType, device: &Device| -> Result<Vec<f64>> {
        let model = resnet(&config, dtype, device)?;
        for (mine, start) in model
            .store()
            .entries()
            .iter()
            .zip(initial.store().entries())
        {
            let value = start.tensor().to_dtype(mine.var.dtype())?;
            mine.var.set(&value.to_device(device)?)?;
        }
        let sgd = SgdConfig {
            lr: 0.01,
            momentum: 0.9,
            weight_decay: 1e-4,
            ..SgdConfig::default()
        };
        let sgd = OptimizerConfig::Sgd(sgd);
        let optimizer = ModelOptimizer::new(sgd, ParamGroups::default(), device, dtype)?;
        let mut trainer = Trainer::new(
            model,
            Box::new(Classification),
            optimizer,
            Checkpointing::None,
        )?;
        let (x, y) = (
            images.to_dtype(dtype)?.to_device(device)?,
            labels.to_device(device)?,
        );
        (0..3)
            .map(|_| Ok(trainer.step(&x, &y, 0.01)?.loss))
            .collect()
    };
    let reference = run(DType::F64, &Device::Cpu)?;
    let (cpu, on_gpu) = (run(DType::F32, &Device::Cpu)?, run(DType::F32, gpu)?);
    println!("ResNet-50 losses, f64 CPU {reference:?}, f32 CPU {cpu:?}, f32 GPU {on_gpu:?}");
    let error = |losses: &[f64]| {
        losses
            .iter()
            .zip(&reference)
            .fold(0f64, |m, (a, b)| m.max((a - b).abs() / b.abs()))
    };
    Ok(F32Losses {
        first_step: (on_gpu[0] - reference[0]).abs() / reference[0].abs(),
        all_steps: error(&on_gpu),
        // f32 trajectories of a BatchNorm network at batch 16 drift from f64 chaotically: the
        // GPU's 3-step error was 2.1e-2 and 2.7e-2 in two calls with random images, against
        // 4x the CPU's own drift (9.1e-2 and 2.7e-2). A wrong kernel drifts by far more; the
        // f64 rows above check exactness.
        all_steps_tolerance: (4.0 * error(&cpu)).max(5e-2),
    })
}

/// The GPU's f32 losses against f64: the first step's relative error (before any update:
/// forward rounding only), and the largest over the steps with its data-derived tolerance.
pub(super) struct F32Losses {
    pub first_step: f64,
    pub all_steps: f64,
    pub all_steps_tolerance: f64,
}

/// How one ResNet-18 run of the step comparisons trains.
struct Resnet18Run<'a> {
    /// Where the optimizer runs: the GPU, or the CPU (offloaded).
    optimizer_device: &'a Device,
    graph: bool,
    steps: usize,
    /// With a dynamic loss scaler growing every clean step, and a NaN batch at the steps of
    /// [`POISONED_STEPS`] (both replayed from the graph), which the scaler must skip.
    scaled: bool,
    /// In f32 with the model and its batch channels-last (cuDNN's NHWC convolutions), instead
    /// of f64 NCHW.
    channels_last: bool,
    /// Each step's batch scaled by its own factor (the replays must read their own batch).
    batches_vary: bool,
    /// Each step launched before the one before it is read (`Trainer::launch`), as the
    /// trainers do, except around the evaluation.
    launch_ahead: bool,
}

/// The steps at which a scaled run's batch is all NaN: its gradients are, and the step is
/// skipped (ResNet-18's f64 gradients stay below 2 in magnitude, so no finite scale overflows
/// them: a scale grown to f64's largest power of two still applied every step).
const POISONED_STEPS: [usize; 2] = [3, 4];

/// The step after which both runs evaluate the batch: the graph run's memory goes back to the
/// device for it and the next replay maps it again.
const EVALUATED_AFTER: usize = 4;

/// ResNet-18 in f64 on `gpu`, trained with SGD (momentum, weight decay) on one fixed batch,
/// the learning rate changing every step: its parameters afterwards (on the CPU) and the steps
/// replayed from a CUDA graph, and the loss scaler's final state (with one).
fn train_resnet18(
    gpu: &Device,
    run: Resnet18Run,
) -> Result<(Tensor, Replays, Option<LossScalerState>)> {
    let dtype = match run.channels_last {
        true => DType::F32,
        false => DType::F64,
    };
    let images = Tensor::randn(0f64, 1.0, (4, 3, 64, 64), gpu)?.to_dtype(dtype)?;
    let images = match run.channels_last {
        true => ops::to_channels_last(&images)?,
        false => images,
    };
    let labels = Tensor::new(&[1u32, 7, 3, 9], gpu)?;
    let config = ResNetConfig::from_name("resnet18", 10)?.with_channels_last(run.channels_last);
    let model = resnet(&config, dtype, gpu)?;
    let sgd = OptimizerConfig::Sgd(SgdConfig {
        lr: 0.01,
        momentum: 0.9,
        weight_decay: 1e-4,
        ..SgdConfig::default()
    });
    let sgd = ModelOptimizer::new(sgd, ParamGroups::default(), run.optimizer_device, dtype)?;
    let mut trainer = Trainer::new(model, Box::new(Classification), sgd, Checkpointing::None)?;
    if run.scaled {
        trainer = trainer.with_loss_scaler(DynamicLossScaler::new(ScalerConfig {
            init_scale: 2f64.powi(10),
            growth_interval: 1,
            ..ScalerConfig::default()
        })?);
    }
    if run.graph {
        trainer = trainer.with_cuda_graph();
    }
    let mut replays = Replays::default();
    let poisoned = (&images * f64::NAN)?;
    let mut in_flight = None;
    for step in 0..run.steps {
        let batch = match (
            run.scaled && POISONED_STEPS.contains(&step),
            run.batches_vary,
        ) {
            (true, _) => poisoned.clone(),
            (false, true) => (&images * (1.0 + step as f64 / 4.0))?,
            (false, false) => images.clone(),
        };
        let lr = 0.01 / (1 + step) as f64;
        let mut outcomes = Vec::new();
        match run.launch_ahead {
            true => {
                let launched = trainer.launch(&batch, &labels, (1, lr))?;
                replays.queued += usize::from(launched.is_queued());
                if let Some(earlier) = in_flight.take() {
                    outcomes.push(trainer.finish(earlier)?);
                }
                match step == EVALUATED_AFTER || step + 1 == run.steps {
                    true => outcomes.push(trainer.finish(launched)?),
                    false => in_flight = Some(launched),
                }
            }
            false => outcomes.push(trainer.step(&batch, &labels, lr)?),
        }
        replays.replayed += outcomes.iter().filter(|o| o.graphed).count();
        if step == EVALUATED_AFTER {
            trainer.evaluate(&images, &labels)?;
        }
    }
    let store = trainer.model().store();
    let params: Vec<Tensor> = store
        .parameter_ids()
        .into_iter()
        .map(|id| store.entries()[id].tensor().flatten_all())
        .collect::<candle_core::Result<_>>()?;
    let params = Tensor::cat(&params, 0)?.to_device(&Device::Cpu)?;
    Ok((params, replays, trainer.loss_scaler_state()?))
}

/// How a run's steps went.
#[derive(Default)]
struct Replays {
    /// Steps replayed from the CUDA graph.
    replayed: usize,
    /// Steps still queued on the device when their launch returned.
    queued: usize,
}

/// ResNet-18 in f64 trained for 6 steps by an eager trainer and by one replaying a CUDA graph
/// after its warm-up: the largest relative difference of the parameters after the steps (the
/// same kernels run in the same order, so it should be 0), or infinity when fewer than 3 steps
/// were replayed. Both draw the same batch (the generator is seeded per run). With `scaled`,
/// the loss scaler's decisions are taken on the device inside the graph: the skipped steps and
/// the final scale must match too, and exactly the poisoned steps must have been skipped
/// (else infinity). Both runs evaluate between two steps: a replay after the graph's memory
/// went back to the device for the evaluation must compute the same step.
pub(super) fn compare_graph_replay(gpu: &Device, scaled: bool, channels_last: bool) -> Result<f64> {
    compare_graph_runs(gpu, (scaled, channels_last), false)
}

/// [`compare_graph_replay`] in f64 with another batch at every step, the graph run launching
/// each step before it reads the one before (`Trainer::launch`), over 8 steps: the replays
/// queued behind a running one must read their own learning rate and batch. Infinity unless at
/// least four launches returned with the step still queued.
pub(super) fn compare_graph_launched_ahead(gpu: &Device) -> Result<f64> {
    compare_graph_runs(gpu, (false, false), true)
}

fn compare_graph_runs(
    gpu: &Device,
    (scaled, channels_last): (bool, bool),
    launch_ahead: bool,
) -> Result<f64> {
    let run = |graph| Resnet18Run {
        optimizer_device: gpu,
        graph,
        // Launched ahead: three replays queued behind a running one, the evaluation between.
        steps: if launch_ahead { 8 } else { 6 },
        scaled,
        channels_last,
        batches_vary: launch_ahead,
        launch_ahead: launch_ahead && graph,
    };
    gpu.set_seed(0)?;
    let (eager, _, eager_scaler) = train_resnet18(gpu, run(false))?;
    gpu.set_seed(0)?;
    let (graphed, replays, graphed_scaler) = train_resnet18(gpu, run(true))?;
    let (replayed, queued) = (replays.replayed, replays.queued);
    println!(
        "CUDA graph: {replayed} steps replayed ({queued} queued at launch), loss scaler \
         {graphed_scaler:?}"
    );
    let skipped = graphed_scaler.as_ref().map_or(0, |s| s.skipped_steps);
    let skipped_as_poisoned = !scaled || skipped == POISONED_STEPS.len() as u64;
    let queued_enough = !launch_ahead || queued >= 4;
    if replayed < 3 || eager_scaler != graphed_scaler || !skipped_as_poisoned || !queued_enough {
        return Ok(f64::INFINITY);
    }
    relative_error(&eager, &graphed)
}

/// ResNet-18 in f64, three SGD steps with the optimizer on the GPU and offloaded (its master
/// copy and momentum in host memory, the CPU rule): the parameters' relative difference (the
/// kernels compute the CPU rule's operations in the same order).
pub(super) fn compare_offload(gpu: &Device) -> Result<f64> {
    let run = |optimizer_device| Resnet18Run {
        optimizer_device,
        graph: false,
        steps: 3,
        scaled: false,
        channels_last: false,
        batches_vary: false,
        launch_ahead: false,
    };
    gpu.set_seed(0)?;
    let (on_gpu, ..) = train_resnet18(gpu, run(gpu))?;
    gpu.set_seed(0)?;
    let (offloaded, ..) = train_resnet18(gpu, run(&Device::Cpu))?;
    relative_error(&on_gpu, &offloaded)
}

/// One whole-graph `backward()` of ResNet-50 (no block-wise tape) on the CPU and on the GPU:
/// the largest per-parameter relative gradient difference (the worst six are printed).
pub(super) fn compare_whole_graph(gpu: &Device) -> Result<f64> {
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
