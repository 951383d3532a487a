//! With the `cuda` feature, compiles this crate's CUDA kernels (`kernels/*.cu`) to PTX with
//! `nvcc`, once for each compute capability the build targets (weft-cuda-build: the GPU found,
//! or `CUDA_COMPUTE_CAP`); the PTX is embedded in the library and the driver loads the best
//! fit for the GPU at first use. Without the feature it does nothing.

use std::path::PathBuf;

const KERNELS: [&str; 23] = [
    "attention",
    "attention_dropout",
    "batch_norm",
    "batch_norm_nhwc",
    "batch_norm_sync",
    "bias",
    "cross_entropy",
    "dropout",
    "embedding",
    "gelu",
    "hold",
    "layer_norm",
    "relu",
    "residual",
    "rotary",
    "max_pool",
    "max_pool_nhwc",
    "multi_tensor",
    "pixels",
    "space_to_depth",
    "swiglu",
    "transpose",
    "unscale",
];

fn main() {
    // The kernel list lives here: a new entry must rebuild.
    println!("cargo::rerun-if-changed=build.rs");
    for header in [
        "block_reduce",
        "float_types",
        "max_pool_nhwc_words",
        "max_pool_window",
        "row_stream",
        "vector",
    ] {
        println!("cargo::rerun-if-changed=kernels/{header}.cuh");
    }
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let caps = weft_cuda_build::compute_caps();
    weft_cuda_build::compile(&manifest.join("kernels"), &KERNELS, &caps, &["-O3"]);
}
