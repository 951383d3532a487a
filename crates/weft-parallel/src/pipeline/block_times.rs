//! Each block's measured time, forward plus backward: the weights [`super::partition::balanced`]
//! cuts a model by when parameter counts say too little about the work (the head's logits and
//! loss, attention over long sequences). The device is synchronised at every block boundary, so
//! on a GPU the times are the kernels', not the host's issuing of them.

use std::time::{Duration, Instant};

use candle_core::Tensor;
use weft_tensor::tape::{self, BackwardHooks, Seed, TapeOptions};
use weft_tensor::{BlockGrads, BlockModel, Mode, TensorError};

use crate::error::Result;

/// Each block's forward-plus-backward time in microseconds (at least 1): the median over
/// `repeats` runs of `model` on `inputs` back-propagating `loss(output)` (a scalar), after one
/// unmeasured run.
pub fn measured_block_times(
    model: &BlockModel,
    inputs: &Tensor,
    loss: impl Fn(&Tensor) -> Result<Tensor>,
    repeats: usize,
) -> Result<Vec<u64>> {
    let blocks = model.blocks().len();
    let mut runs: Vec<Vec<Duration>> = vec![Vec::new(); blocks];
    for run in 0..=repeats.max(1) {
        let times = time_blocks(model, inputs, &loss)?;
        if run > 0 {
            for (block, time) in times.into_iter().enumerate() {
                runs[block].push(time);
            }
        }
    }
    Ok(runs
        .into_iter()
        .map(|mut times| {
            times.sort();
            (times[times.len() / 2].as_micros() as u64).max(1)
        })
        .collect())
}

/// One forward and backward, timed per block.
fn time_blocks(
    model: &BlockModel,
    inputs: &Tensor,
    loss: &impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<Vec<Duration>> {
    let device = model.store().device().clone();
    let blocks = model.blocks().len();
    let mut times = vec![Duration::ZERO; blocks];
    let options = TapeOptions {
        mode: Mode::TRAIN,
        ..TapeOptions::default()
    };
    device.synchronize()?;
    let mut last = (blocks, Instant::now());
    let tape = tape::forward_with(model, inputs, &options, |block| {
        device.synchronize()?;
        if last.0 < blocks {
            times[last.0] += last.1.elapsed();
        }
        last = (block, Instant::now());
        Ok::<(), TensorError>(())
    })?;
    let loss = loss(tape.output())?;
    device.synchronize()?;
    times[last.0] += last.1.elapsed();
    // The loss's own backward belongs to the last block.
    let mut hooks = BlockTimer {
        device: &device,
        times: &mut times,
        current: Some((blocks - 1, Instant::now())),
    };
    tape.backward_with(Seed::Loss(&loss), model, &mut hooks)?;
    hooks.stop()?;
    Ok(times)
}

/// Adds each block's backward time to its forward time.
struct BlockTimer<'a> {
    device: &'a candle_core::Device,
    times: &'a mut [Duration],
    current: Option<(usize, Instant)>,
}

impl BlockTimer<'_> {
    fn stop(&mut self) -> std::result::Result<(), TensorError> {
        self.device.synchronize()?;
        if let Some((block, start)) = self.current.take() {
            self.times[block] += start.elapsed();
        }
        Ok(())
    }
}

impl BackwardHooks<TensorError> for BlockTimer<'_> {
    fn before_block(&mut self, block: usize) -> std::result::Result<(), TensorError> {
        self.stop()?;
        self.current = Some((block, Instant::now()));
        Ok(())
    }

    fn block_ready(&mut self, _grads: BlockGrads) -> std::result::Result<(), TensorError> {
        Ok(())
    }
}
