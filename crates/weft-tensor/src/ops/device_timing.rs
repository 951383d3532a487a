//! The device time of a sequence of launches, for choices made by timing (`conv_stats`): the
//! stream is held busy (`kernels/hold.cu`) while the host queues the timed runs, so that the
//! events around them measure the device's work back to back and not the host's pace of
//! launching (weft's eager ops spend tens of microseconds on the host each, as long as many a
//! kernel). Synchronises the stream: never during a CUDA-graph capture.

use std::sync::Arc;

use candle_core::cuda::CudaDevice;
use candle_core::Result;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

use super::cuda_launch::{function_named, launched, HOLD};

/// How long the stream is held while the host queues the runs.
const HOLD_NS: u64 = 3_000_000;

/// Microseconds per run of `run` on `device`'s stream: one untimed run, then `runs` timed ones
/// queued behind a hold of the stream.
pub(super) fn device_micros(
    (device, stream): (&CudaDevice, &Arc<CudaStream>),
    runs: usize,
    mut run: impl FnMut() -> Result<()>,
) -> Result<f32> {
    let fail = |e: cudarc::driver::DriverError| {
        candle_core::Error::Msg(format!("timing on the device: {e:?}"))
    };
    run()?;
    let hold = function_named(device, &HOLD, "hold_stream")?;
    let mut builder = hold.builder();
    builder.arg(&HOLD_NS);
    // SAFETY: `hold_stream(unsigned long long)` reads its one argument and nothing else.
    launched("hold_stream", unsafe {
        builder.launch(LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        })
    })?;
    let event = || {
        stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(fail)
    };
    let start = event()?;
    for _ in 0..runs {
        run()?;
    }
    let end = event()?;
    end.synchronize().map_err(fail)?;
    Ok(start.elapsed_ms(&end).map_err(fail)? * 1e3 / runs as f32)
}
