//! Hugging Face checkpoint files (the layout `save_pretrained` writes): a model's weights in one
//! `model.safetensors`, or in shards `model-0000X-of-0000N.safetensors` that
//! `model.safetensors.index.json` maps every key to. Read from a file or a folder; written
//! into a folder with shards above a size, each file atomic and durable, the index last.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use crate::error::{Result, TensorError};
use crate::state_dict::save_tensors;

/// The weights' file name of an unsharded checkpoint.
pub const WEIGHTS: &str = "model.safetensors";
/// The index of a sharded checkpoint.
pub const INDEX: &str = "model.safetensors.index.json";

/// The index file's contents that weft reads and writes.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Index {
    #[serde(default)]
    metadata: serde_json::Map<String, serde_json::Value>,
    weight_map: BTreeMap<String, String>,
}

fn damaged(file: &Path, reason: impl Into<String>) -> TensorError {
    TensorError::DamagedFile {
        file: file.into(),
        reason: reason.into(),
    }
}

/// Every tensor of the checkpoint at `path` by key, on `device`: a safetensors file, or a
/// folder holding `model.safetensors` or a sharded checkpoint's index and shards. Each key of
/// a sharded checkpoint must be in the shard its index names, and each shard's keys in the
/// index; errors name the file.
pub fn load_weights(path: &Path, device: &Device) -> Result<HashMap<String, Tensor>> {
    if !path.is_dir() {
        return load_file(path, device);
    }
    let single = path.join(WEIGHTS);
    let index = path.join(INDEX);
    if !index.is_file() {
        if single.is_file() {
            return load_file(&single, device);
        }
        let missing = std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no {WEIGHTS} and no {INDEX}"),
        );
        return Err(TensorError::Io {
            file: path.into(),
            source: missing,
        });
    }
    let text = std::fs::read_to_string(&index).map_err(|source| TensorError::Io {
        file: index.clone(),
        source,
    })?;
    let parsed: Index =
        serde_json::from_str(&text).map_err(|e| damaged(&index, format!("not an index: {e}")))?;
    let mut shards: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (key, shard) in &parsed.weight_map {
        if shard.contains('/') || shard.contains('\\') || shard.starts_with('.') {
            return Err(damaged(
                &index,
                format!("key `{key}`: shard name {shard:?}"),
            ));
        }
        shards.entry(shard).or_default().push(key);
    }
    let mut all = HashMap::with_capacity(parsed.weight_map.len());
    for (shard, keys) in shards {
        let file = path.join(shard);
        let mut loaded = load_file(&file, device)?;
        for key in keys {
            let value = loaded.remove(key).ok_or_else(|| TensorError::MissingKey {
                file: file.clone(),
                key: key.to_string(),
            })?;
            all.insert(key.to_string(), value);
        }
        if let Some(key) = loaded.keys().min() {
            return Err(damaged(&index, format!("{shard} holds `{key}`, unlisted")));
        }
    }
    Ok(all)
}

fn load_file(path: &Path, device: &Device) -> Result<HashMap<String, Tensor>> {
    if !path.is_file() {
        let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        return Err(TensorError::Io {
            file: path.into(),
            source: missing,
        });
    }
    candle_core::safetensors::load(path, device).map_err(|source| TensorError::Safetensors {
        file: path.into(),
        source,
    })
}

/// Writes `tensors` (in this order) into the folder `dir` as `save_pretrained` does: one
/// `model.safetensors` when their bytes are at most `max_shard_bytes`, otherwise consecutive
/// shards of at most that many bytes each (a larger tensor alone in its shard) and the index,
/// written last. Returns the files written.
pub fn save_weights(
    tensors: &[(String, Tensor)],
    dir: &Path,
    max_shard_bytes: usize,
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|source| TensorError::Io {
        file: dir.into(),
        source,
    })?;
    let bytes = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
    let total: usize = tensors.iter().map(|(_, t)| bytes(t)).sum();
    if total <= max_shard_bytes {
        let path = dir.join(WEIGHTS);
        save_tensors(&tensors.iter().cloned().collect(), &path)?;
        return Ok(vec![path]);
    }
    let mut shards: Vec<Vec<&(String, Tensor)>> = vec![Vec::new()];
    let mut filled = 0;
    for pair in tensors {
        let size = bytes(&pair.1);
        let current = shards.last_mut().expect("one shard at least");
        if !current.is_empty() && filled + size > max_shard_bytes {
            shards.push(Vec::new());
            filled = 0;
        }
        shards.last_mut().expect("pushed").push(pair);
        filled += size;
    }
    let count = shards.len();
    let mut written = Vec::with_capacity(count + 1);
    let mut weight_map = BTreeMap::new();
    for (i, shard) in shards.into_iter().enumerate() {
        let name = format!("model-{:05}-of-{count:05}.safetensors", i + 1);
        let path = dir.join(&name);
        let map: HashMap<String, Tensor> =
            shard.iter().map(|p| (p.0.clone(), p.1.clone())).collect();
        save_tensors(&map, &path)?;
        weight_map.extend(shard.iter().map(|p| (p.0.clone(), name.clone())));
        written.push(path);
    }
    let mut metadata = serde_json::Map::new();
    metadata.insert("total_size".into(), total.into());
    let index = Index {
        metadata,
        weight_map,
    };
    let path = dir.join(INDEX);
    let text = serde_json::to_vec_pretty(&index).expect("an index serialises");
    crate::durable::write(&path, &text).map_err(|source| TensorError::Io {
        file: path.clone(),
        source,
    })?;
    written.push(path);
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensors() -> Vec<(String, Tensor)> {
        (0..5)
            .map(|i| {
                let value = Tensor::full(i as f32, (i + 1, 3), &Device::Cpu).unwrap();
                (format!("layers.{i}.weight"), value)
            })
            .collect()
    }

    fn assert_same(loaded: &HashMap<String, Tensor>, saved: &[(String, Tensor)]) {
        assert_eq!(loaded.len(), saved.len());
        for (key, value) in saved {
            let back = loaded[key].to_vec2::<f32>().unwrap();
            assert_eq!(back, value.to_vec2::<f32>().unwrap(), "{key}");
        }
    }

    #[test]
    fn one_file_below_the_shard_size() {
        let dir = tempfile::tempdir().unwrap();
        let written = save_weights(&tensors(), dir.path(), 1 << 20).unwrap();
        assert_eq!(written, [dir.path().join(WEIGHTS)]);
        assert_same(&load_weights(dir.path(), &Device::Cpu).unwrap(), &tensors());
        assert_same(
            &load_weights(&written[0], &Device::Cpu).unwrap(),
            &tensors(),
        );
    }

    #[test]
    fn shards_with_an_index_above_it() {
        let dir = tempfile::tempdir().unwrap();
        // 12, 24, 36, 48, 60 bytes: shards of at most 40 bytes are [12, 24], [36], [48], [60].
        let written = save_weights(&tensors(), dir.path(), 40).unwrap();
        let names: Vec<_> = written.iter().map(|p| p.file_name().unwrap()).collect();
        assert_eq!(names.len(), 5);
        assert_eq!(names[0], "model-00001-of-00004.safetensors");
        assert_eq!(names[4], INDEX);
        let index: Index =
            serde_json::from_slice(&std::fs::read(dir.path().join(INDEX)).unwrap()).unwrap();
        assert_eq!(index.metadata["total_size"], 180);
        assert_eq!(
            index.weight_map["layers.1.weight"],
            "model-00001-of-00004.safetensors"
        );
        assert_eq!(
            index.weight_map["layers.4.weight"],
            "model-00004-of-00004.safetensors"
        );
        assert_same(&load_weights(dir.path(), &Device::Cpu).unwrap(), &tensors());
    }

    #[test]
    fn an_index_and_its_shards_must_agree() {
        let dir = tempfile::tempdir().unwrap();
        save_weights(&tensors(), dir.path(), 40).unwrap();
        let index_path = dir.path().join(INDEX);
        let mut index: Index =
            serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
        let shard = index.weight_map.remove("layers.0.weight").unwrap();
        index.weight_map.insert("layers.9.weight".into(), shard);
        std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
        let error = load_weights(dir.path(), &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(error.contains("missing key `layers.9.weight`"), "{error}");
        index.weight_map.remove("layers.9.weight");
        std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
        let error = load_weights(dir.path(), &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("holds `layers.0.weight`, unlisted"),
            "{error}"
        );
        index
            .weight_map
            .insert("x".into(), "../elsewhere.safetensors".into());
        std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
        let error = load_weights(dir.path(), &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(error.contains("shard name"), "{error}");
    }

    #[test]
    fn a_folder_without_weights_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let error = load_weights(dir.path(), &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(error.contains(&dir.path().display().to_string()), "{error}");
        assert!(error.contains(INDEX), "{error}");
    }
}
