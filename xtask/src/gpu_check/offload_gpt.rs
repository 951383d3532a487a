//! `train-gpt` with the optimizer offloaded to the host (`--offload-optimizer`: the fp32 master
//! weights and AdamW's states in host memory, the update on the CPU) against the same run with
//! the optimizer on the GPU, through the whole trainer: in fp32 and in bf16-mixed (whose bf16
//! parameters are rounded from the same fp32 masters), and with DeepSpeed's delayed update
//! (one step stale from step 3 on: the same losses up to that step, other ones after).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use weft_train::flags::Precision;

const STEPS: usize = 6;

/// The largest relative difference of the step losses of `gpt-tiny` on the GPU, offloaded
/// against on the GPU, over fp32 and bf16-mixed runs; infinity when a run logged another number
/// of steps, or when the delayed update did not change the losses after its first step.
pub(super) fn compare_offloaded_gpt() -> Result<f64> {
    let out = std::env::temp_dir().join(format!("weft-gpu-check-offload-{}", std::process::id()));
    let result = (|| {
        let mut worst = 0f64;
        let mut fp32_on_gpu = Vec::new();
        for precision in [Precision::Fp32, Precision::Bf16Mixed] {
            let on_gpu = losses(&train(&out, precision, (false, None))?)?;
            let offloaded = losses(&train(&out, precision, (true, None))?)?;
            if on_gpu.len() != STEPS || offloaded.len() != STEPS {
                return Ok(f64::INFINITY);
            }
            worst = worst.max(largest_difference(&on_gpu, &offloaded));
            if precision == Precision::Fp32 {
                fp32_on_gpu = on_gpu;
            }
        }
        let on_gpu = fp32_on_gpu;
        let delayed = losses(&train(&out, Precision::Fp32, (true, Some(3)))?)?;
        println!("train-gpt delayed update from step 3: losses {delayed:?} against {on_gpu:?}");
        if delayed.len() != STEPS {
            return Ok(f64::INFINITY);
        }
        let (before, after) = (
            largest_difference(&on_gpu[..4], &delayed[..4]),
            largest_difference(&on_gpu[4..], &delayed[4..]),
        );
        if after < 1e-6 {
            return Ok(f64::INFINITY);
        }
        Ok(worst.max(before))
    })();
    let _ = std::fs::remove_dir_all(&out);
    result
}

fn largest_difference(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| ((x - y) / y).abs())
        .fold(0f64, f64::max)
}

/// One run into `out`, built from values; its folder.
fn train(
    out: &Path,
    precision: Precision,
    (offload, delayed_from): (bool, Option<u64>),
) -> Result<PathBuf> {
    let name = format!("{precision:?}-offload-{offload}-delayed-{delayed_from:?}");
    let mut args = weft_train::GptArgs::default();
    args.training.device = "cuda".into();
    args.training.batch_size = 8;
    args.training.steps = Some(STEPS);
    args.data.seq_len = Some(64);
    args.data.synthetic_tokens = 65536;
    args.data.val_tokens = 1024;
    args.precision.precision = precision;
    args.parallel.offload_optimizer = offload;
    args.parallel.delayed_update_from = delayed_from;
    args.log.quiet = true;
    (args.log.out, args.log.name) = (out.to_path_buf(), Some(name.clone()));
    weft_train::gpt::run(&args)?;
    Ok(out.join(name))
}

/// Each step line's loss, in order.
fn losses(run: &Path) -> Result<Vec<f64>> {
    let path = run.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["type"] == "step")
        .filter_map(|l| l["loss"].as_f64())
        .collect())
}
