//! What a CUDA process holds beyond its tensors: the context and the libraries' handles
//! (cuBLAS, cuDNN, NCCL), cuDNN's algorithm-search workspace and the memory pool's rounding.
//! Not derived from the model: measured, as the device's memory in use minus the peak bytes of
//! tensors, for weft's ResNet-50 step (fp32, batch 32) on an H100 with CUDA 13 and cuDNN 9 on
//! 2026-11-25: 3775 MiB − 2985 MiB = 790 MiB, with or without a CUDA graph
//! (docs/history/2026-11.md, "ZeRO stages 1 and 2", GPU memory). Other GPUs and drivers differ by tens
//! of MiB.

use super::{Device, PlanSettings, Row};

/// The measured overhead, in bytes.
const CUDA_RUNTIME_BYTES: u64 = 790 << 20;

/// The runtime row of a CUDA rank (none on the CPU).
pub(super) fn rows(settings: &PlanSettings) -> Vec<Row> {
    match settings.device {
        Device::Cpu => Vec::new(),
        Device::Cuda => vec![Row::new(
            "cuda_runtime",
            CUDA_RUNTIME_BYTES,
            "CUDA context, library handles, cuDNN workspace, pool rounding: 790 MiB measured on an H100 (CUDA 13, cuDNN 9)".into(),
        )],
    }
}
