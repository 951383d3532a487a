//! NVTX ranges for the timeline's spans under the `nvtx` feature (turned on by `cuda`) (Nsight Systems shows them
//! beside the kernels); nothing without it. Ranges are start/end, not push/pop, so a span may
//! end on another thread than the one it began on.

/// An open NVTX range, ended when dropped.
#[derive(Debug)]
pub struct NvtxRange {
    #[cfg(feature = "nvtx")]
    id: i32,
}

impl NvtxRange {
    #[cfg(feature = "nvtx")]
    pub fn start(name: &str) -> Self {
        Self {
            id: nvtx::range_start!("{}", name),
        }
    }

    #[cfg(not(feature = "nvtx"))]
    pub fn start(_name: &str) -> Self {
        Self {}
    }

    /// Ends the range now (as dropping it does).
    pub fn end(self) {}
}

#[cfg(feature = "nvtx")]
impl Drop for NvtxRange {
    fn drop(&mut self) {
        let id = self.id;
        nvtx::range_end!(id);
    }
}
