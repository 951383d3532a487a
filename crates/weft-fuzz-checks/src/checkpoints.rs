//! Checkpoint files: a sharded checkpoint's manifest, safetensors bytes, and a run's records
//! (`progress.json`, `tensor-parallel.json`) read as a resume reads them.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use weft_parallel::zero::manifest::Manifest;
use weft_tensor::{EntryKind, FlatLayout, ParamStore};

fn small_store() -> ParamStore {
    let mut store = ParamStore::new(&Device::Cpu, DType::F32);
    let entries = [
        ("layer.weight", EntryKind::Parameter, &[2usize, 3][..], 1.0),
        ("layer.bias", EntryKind::Parameter, &[3], 1.0),
        ("norm.running_mean", EntryKind::Buffer, &[3], 0.0),
    ];
    for (name, kind, shape, value) in entries {
        let t = (Tensor::ones(shape, DType::F32, &Device::Cpu).expect("a tensor") * value)
            .expect("a tensor");
        store.register(name, kind, t).expect("a fresh name");
    }
    store
}

/// A sharded checkpoint's `manifest.json`: parsing and the layout check refuse with an error,
/// never a panic; an accepted manifest names only files inside its folder, its shards cover
/// the flat buffers in order and its entries lie inside them.
pub fn checkpoint_manifest(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(manifest) = Manifest::parse(text, Path::new("ckpt/manifest.json")) else {
        return;
    };
    let mut covered = 0;
    for shard in &manifest.shards {
        assert!(!shard.file.contains('/') && shard.file != "..");
        assert_eq!(shard.start, covered);
        covered = shard.end;
    }
    assert_eq!(covered, manifest.flat_len);
    for entry in &manifest.entries {
        let numel: usize = entry.shape.iter().product();
        assert!(entry.offset + numel <= manifest.flat_len);
    }
    let layout = FlatLayout::parameters(&small_store());
    if manifest.check_layout(&layout, Path::new("ckpt")).is_ok() {
        assert_eq!(manifest.flat_len, layout.len());
    }
}

/// Safetensors bytes loaded into a small model: a refused file is an error, never a panic, and
/// leaves the model as it was.
pub fn safetensors_load(data: &[u8]) {
    let store = small_store();
    let origin = Path::new("fuzz.safetensors");
    if weft_tensor::state_dict::load_safetensors_bytes(&store, origin, data).is_err() {
        let weight = store.get("layer.weight").expect("an entry").tensor();
        let values: Vec<f32> = weight
            .flatten_all()
            .and_then(|t| t.to_vec1())
            .expect("values");
        assert!(
            values.iter().all(|&v| v == 1.0),
            "a refused file changed the model"
        );
    }
}

/// A run's records read as a resume reads them: the bytes as `progress.json` of a checkpoint
/// folder, checked ([`weft_train::run_checkpoints::check`]), and as the `tensor-parallel.json`
/// of a small two-rank checkpoint whose slices are whole, exported to the full model
/// ([`weft_train::gpt_checkpoint::export_full_model`]). Both are a value or an error, never
/// a panic; an accepted record names the folder's step.
pub fn run_records(data: &[u8]) {
    let root = tempfile::tempdir().expect("a scratch folder");
    let dir = root.path().join("run/checkpoints/step-00000004");
    std::fs::create_dir_all(&dir).expect("a checkpoint folder");
    std::fs::write(dir.join("progress.json"), data).expect("a record");
    std::fs::write(dir.join("manifest.json"), "{}").expect("a manifest");
    if let Ok(progress) = weft_train::run_checkpoints::check(&dir) {
        assert_eq!(progress.step, 4);
    }
    let tp = root.path().join("tp");
    for rank in 0..2 {
        let part = tp.join(format!("tp-{rank:05}-of-00002"));
        std::fs::create_dir_all(&part).expect("a rank's folder");
        let w = Tensor::ones((2, 4), DType::F32, &Device::Cpu).expect("a tensor");
        let tensors = HashMap::from([("w".to_string(), w)]);
        weft_tensor::state_dict::save_tensors(&tensors, &part.join("model.safetensors"))
            .expect("a model file");
    }
    std::fs::write(tp.join("tensor-parallel.json"), data).expect("a manifest");
    let _ = weft_train::gpt_checkpoint::export_full_model(&tp);
}
