//! The properties weft's fuzz targets check, each a function of arbitrary bytes that returns
//! when the property holds (an input refused with an error is fine) and panics when it fails.
//! `fuzz/fuzz_targets/<name>.rs` hands libFuzzer's inputs to the function of the same name
//! (`cargo xtask fuzz`, nightly); `tests/regressions.rs` replays every input kept under
//! `fuzz/regressions/<name>/` through it on stable, in the CI suite. [`TARGETS`] lists them.

mod checkpoints;
mod inputs;
mod launch;
mod store;

pub use checkpoints::{checkpoint_manifest, run_records, safetensors_load};
pub use inputs::{cifar_records, image_decode};
pub use launch::launch_env;
pub use store::{store_protocol, store_server};

/// A target's check: returns when its property holds for the input, panics when it fails.
pub type Check = fn(&[u8]);

/// Every target by name, with its check.
pub const TARGETS: [(&str, Check); 8] = [
    ("cifar_records", cifar_records),
    ("safetensors_load", safetensors_load),
    ("checkpoint_manifest", checkpoint_manifest),
    ("store_protocol", store_protocol),
    ("store_server", store_server),
    ("run_records", run_records),
    ("launch_env", launch_env),
    ("image_decode", image_decode),
];
