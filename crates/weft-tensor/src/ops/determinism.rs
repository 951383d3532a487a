//! Deterministic GPU algorithms on request, as PyTorch's `use_deterministic_algorithms` with
//! `cudnn.deterministic`: cuDNN convolutions are then chosen by cuDNN's heuristics among the
//! algorithms it marks deterministic, never by timing (a timed choice can differ from run to
//! run, and each algorithm rounds differently). weft's own CUDA kernels add in a fixed order
//! (no atomics) and the CPU path is reproducible for a given thread count either way.

use std::sync::atomic::{AtomicBool, Ordering};

static DETERMINISTIC: AtomicBool = AtomicBool::new(false);

/// Turns deterministic algorithm choice on or off (off by default); set it before the first
/// convolution, whose choices are kept.
pub fn set_deterministic(on: bool) {
    DETERMINISTIC.store(on, Ordering::Relaxed);
}

/// Whether algorithms must be deterministic.
pub fn deterministic() -> bool {
    DETERMINISTIC.load(Ordering::Relaxed)
}
