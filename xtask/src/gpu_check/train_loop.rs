//! The ResNet trainer's loop on one GPU with each replay launched before the step before it is
//! read (`--launch-ahead true`, the default) against the same run reading every step first and
//! against an eager run (`--cuda-graph false`): the loop must log each step's own loss, in
//! order, and save its checkpoint after the step it names, with nothing launched beyond it; the
//! replays, whose batches are normalised straight into the captured step's input buffer, must
//! train on the batches the eager run trains on.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use weft_train::flags::Augment;

/// Steps of each run; a checkpoint after [`SAVED_AFTER`] of them.
const STEPS: usize = 14;
const SAVED_AFTER: usize = 7;

/// ResNet-20 on synthetic 32×32 images, `--deterministic`, with and without launching ahead,
/// and eagerly: the largest relative difference of the step losses in `metrics.jsonl`. Infinity when a run
/// logged another number of steps or its steps out of order, when the launched-ahead run
/// replayed fewer than `STEPS - 4` steps from its graph (its trace's "cuda graph launch"
/// spans), or when its checkpoint after step [`SAVED_AFTER`] holds other parameters than the
/// other run's.
pub(super) fn compare_launched_ahead_loop() -> Result<f64> {
    let out = std::env::temp_dir().join(format!("weft-gpu-check-loop-{}", std::process::id()));
    let result = (|| {
        let ahead = train(&out, (true, true))?;
        let read_first = train(&out, (false, true))?;
        let eager = step_losses(&train(&out, (false, false))?)?;
        let (losses, graphed) = (step_losses(&ahead)?, graph_launches(&ahead)?);
        let reference = step_losses(&read_first)?;
        println!(
            "train-resnet launched ahead: {} steps logged, {graphed} replays traced",
            losses.len()
        );
        let in_order = |l: &[(usize, f64)]| l.iter().enumerate().all(|(i, (s, _))| i == *s);
        if losses.len() != STEPS
            || reference.len() != STEPS
            || eager.len() != STEPS
            || !in_order(&losses)
            || !in_order(&reference)
            || graphed + 4 < STEPS
            || saved(&ahead)? != saved(&read_first)?
        {
            return Ok(f64::INFINITY);
        }
        Ok(losses
            .iter()
            .zip(&reference)
            .chain(losses.iter().zip(&eager))
            .map(|((_, a), (_, b))| ((a - b) / b).abs())
            .fold(0f64, f64::max))
    })();
    // `--deterministic` set a process-wide switch; the other checks choose their algorithms.
    weft_tensor::ops::set_deterministic(false);
    let _ = std::fs::remove_dir_all(&out);
    result
}

/// One run into `out/ahead-<launch_ahead>-graph-<cuda_graph>`, built from values; its folder.
fn train(out: &Path, (launch_ahead, cuda_graph): (bool, bool)) -> Result<PathBuf> {
    let name = format!("ahead-{launch_ahead}-graph-{cuda_graph}");
    let mut args = weft_train::TrainArgs::default();
    args.training.device = "cuda".into();
    args.model.model = "resnet20".into();
    args.data.image_size = 32;
    (args.data.synthetic_train, args.data.synthetic_val) = (1024, 64);
    args.data.augment = Augment::None;
    args.data.shuffle = false;
    args.training.batch_size = 32;
    args.training.steps = Some(STEPS);
    args.training.deterministic = true;
    args.checkpoints.save_every = Some(SAVED_AFTER);
    (args.parallel.launch_ahead, args.parallel.cuda_graph) = (launch_ahead, cuda_graph);
    args.log.quiet = true;
    (args.log.out, args.log.name) = (out.to_path_buf(), Some(name.clone()));
    weft_train::resnet::run(&args)?;
    Ok(out.join(name))
}

/// `train-gpt` on `gpt-tiny` on the GPU into `out/name`, built from values: 8 sequences of 64
/// synthetic tokens a step for `steps` steps, quiet, then as `configure` sets it; its folder.
pub(super) fn tiny_gpt_run(
    out: &Path,
    name: &str,
    steps: usize,
    configure: impl FnOnce(&mut weft_train::GptArgs),
) -> Result<PathBuf> {
    let mut args = weft_train::GptArgs::default();
    args.training.device = "cuda".into();
    (args.training.batch_size, args.training.steps) = (8, Some(steps));
    args.data.seq_len = Some(64);
    (args.data.synthetic_tokens, args.data.val_tokens) = (65536, 1024);
    args.log.quiet = true;
    (args.log.out, args.log.name) = (out.to_path_buf(), Some(name.into()));
    configure(&mut args);
    weft_train::gpt::run(&args)?;
    Ok(out.join(name))
}

/// Each step line's step and loss, as logged.
pub(super) fn step_losses(run: &Path) -> Result<Vec<(usize, f64)>> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl"))?;
    let mut losses = Vec::new();
    for line in text.lines() {
        let value: serde_json::Value = serde_json::from_str(line)?;
        if let (Some(step), Some(loss)) = (value["step"].as_u64(), value["loss"].as_f64()) {
            losses.push((step as usize, loss));
        }
    }
    Ok(losses)
}

/// The replays the run's trace recorded.
pub(super) fn graph_launches(run: &Path) -> Result<usize> {
    let trace = std::fs::read_to_string(run.join("trace-rank0.json"))?;
    Ok(trace.matches("\"cuda graph launch\"").count())
}

/// The bytes of the model's weights in the checkpoint saved after step [`SAVED_AFTER`].
fn saved(run: &Path) -> Result<Vec<u8>> {
    let weights = weft_train::run_checkpoints::step_dir(run, SAVED_AFTER).join("model.safetensors");
    std::fs::read(&weights).with_context(|| format!("{}: no checkpoint", weights.display()))
}
