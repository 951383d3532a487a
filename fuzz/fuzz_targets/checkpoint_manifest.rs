//! A sharded checkpoint's `manifest.json`: parsing and the layout check refuse with an error,
//! never a panic, and an accepted manifest names only files inside its folder and shards that
//! cover the model's flat buffers exactly.
#![no_main]

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use libfuzzer_sys::fuzz_target;
use weft_parallel::zero::manifest::Manifest;
use weft_tensor::{EntryKind, FlatLayout, ParamStore};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(manifest) = Manifest::parse(text, Path::new("ckpt/manifest.json")) else {
        return;
    };
    for shard in &manifest.shards {
        assert!(!shard.file.contains('/') && shard.file != "..");
    }
    let mut store = ParamStore::new(&Device::Cpu, DType::F32);
    let w = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
    store.register("w", EntryKind::Parameter, w).unwrap();
    let layout = FlatLayout::parameters(&store);
    if manifest.check_layout(&layout, Path::new("ckpt")).is_ok() {
        let covered: usize = manifest.shards.iter().map(|s| s.end - s.start).sum();
        assert_eq!(covered, layout.len());
    }
});
