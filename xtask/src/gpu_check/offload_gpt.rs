//! `train-gpt` with the optimizer offloaded to the host (`--offload-optimizer`: the fp32 master
//! weights and AdamW's states in host memory, the update on the CPU) against the same run with
//! the optimizer on the GPU, through the whole trainer: in fp32 and in bf16-mixed (whose bf16
//! parameters are rounded from the same fp32 masters), and with DeepSpeed's delayed update
//! (one step stale from step 3 on: the same losses up to that step, other ones after).

use std::path::Path;

use anyhow::Result;
use weft_train::flags::Precision;

use super::train_loop::{step_losses, tiny_gpt_run};

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
            let on_gpu = train(&out, precision, (false, None))?;
            let offloaded = train(&out, precision, (true, None))?;
            if on_gpu.len() != STEPS || offloaded.len() != STEPS {
                return Ok(f64::INFINITY);
            }
            worst = worst.max(largest_difference(&on_gpu, &offloaded));
            if precision == Precision::Fp32 {
                fp32_on_gpu = on_gpu;
            }
        }
        let on_gpu = fp32_on_gpu;
        let delayed = train(&out, Precision::Fp32, (true, Some(3)))?;
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

/// One run of [`STEPS`] steps into `out`; its losses.
fn train(
    out: &Path,
    precision: Precision,
    (offload, delayed_from): (bool, Option<u64>),
) -> Result<Vec<f64>> {
    let name = format!("{precision:?}-offload-{offload}-delayed-{delayed_from:?}");
    let run = tiny_gpt_run(out, &name, STEPS, |args| {
        args.precision.precision = precision;
        args.parallel.offload_optimizer = offload;
        args.parallel.delayed_update_from = delayed_from;
    })?;
    Ok(step_losses(&run)?
        .into_iter()
        .map(|(_, loss)| loss)
        .collect())
}
