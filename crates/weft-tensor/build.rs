//! With the `cuda` feature, compiles this crate's CUDA kernels (`kernels/*.cu`) to PTX with
//! `nvcc` for `CUDA_COMPUTE_CAP` (default 90: H100/H200); the PTX is embedded in the library and
//! loaded by the driver at first use. Without the feature it does nothing.

use std::path::PathBuf;
use std::process::Command;

const KERNELS: [&str; 19] = [
    "attention",
    "batch_norm",
    "batch_norm_nhwc",
    "batch_norm_sync",
    "bias",
    "cross_entropy",
    "embedding",
    "gelu",
    "hold",
    "layer_norm",
    "relu",
    "residual",
    "max_pool",
    "max_pool_nhwc",
    "multi_tensor",
    "pixels",
    "space_to_depth",
    "transpose",
    "unscale",
];

fn main() {
    println!("cargo::rerun-if-env-changed=CUDA_COMPUTE_CAP");
    // The kernel list lives here: a new entry must rebuild.
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=kernels/block_reduce.cuh");
    println!("cargo::rerun-if-changed=kernels/float_types.cuh");
    println!("cargo::rerun-if-changed=kernels/max_pool_nhwc_words.cuh");
    println!("cargo::rerun-if-changed=kernels/max_pool_window.cuh");
    println!("cargo::rerun-if-changed=kernels/row_stream.cuh");
    println!("cargo::rerun-if-changed=kernels/vector.cuh");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let nvcc = std::env::var_os("CUDA_HOME")
        .map(|home| PathBuf::from(home).join("bin/nvcc"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    for kernel in KERNELS {
        let source = manifest.join("kernels").join(format!("{kernel}.cu"));
        println!("cargo::rerun-if-changed={}", source.display());
        let status = Command::new(&nvcc)
            .args(["--ptx", &format!("-arch=compute_{cap}"), "-O3"])
            .arg(&source)
            .arg("-o")
            .arg(out.join(format!("{kernel}.ptx")))
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => panic!("nvcc failed on {} ({s})", source.display()),
            Err(e) => panic!(
                "the `cuda` feature needs nvcc (CUDA_HOME/bin or PATH) to compile {}: {e}",
                source.display()
            ),
        }
    }
}
