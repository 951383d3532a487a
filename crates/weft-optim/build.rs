//! With the `cuda` feature, compiles the optimizers' CUDA kernels (`kernels/optimizers.cu`) to
//! PTX with `nvcc`, once for each compute capability the build targets (weft-cuda-build), without
//! fused multiply-adds so that each update rounds as the CPU rule does; the PTX is embedded in
//! the library and the driver loads the best fit for the GPU at first use. Without the feature
//! it does nothing.

use std::path::PathBuf;

fn main() {
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let caps = weft_cuda_build::compute_caps();
    let flags = ["-O3", "--fmad=false"];
    weft_cuda_build::compile(&manifest.join("kernels"), &["optimizers"], &caps, &flags);
}
