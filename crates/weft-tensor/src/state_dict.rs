//! Saving and loading a [`ParamStore`] as safetensors, with PyTorch `state_dict` key names.
//!
//! Saving is atomic and durable (written to a temporary file in the same folder, flushed, then
//! renamed: [`crate::durable`]), so a crash never leaves a half-written checkpoint. Loading is strict: a missing key, an unexpected key, a
//! shape or a dtype mismatch is an error naming the file and the key.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;

use crate::error::{Result, TensorError};
use crate::params::{EntryId, ParamStore};

/// Writes every parameter and buffer of `store` to `path` (atomically).
pub fn save_safetensors(store: &ParamStore, path: &Path) -> Result<()> {
    let tensors: HashMap<String, Tensor> = store
        .entries()
        .iter()
        .map(|e| (e.name.clone(), e.tensor().clone()))
        .collect();
    save_tensors(&tensors, path)
}

/// Writes `tensors` by name to `path` (atomically).
pub fn save_tensors(tensors: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
    let tmp = temporary_sibling(path);
    candle_core::safetensors::save(tensors, &tmp).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        TensorError::Safetensors {
            file: path.into(),
            source,
        }
    })?;
    crate::durable::rename(&tmp, path).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        TensorError::Io {
            file: path.into(),
            source,
        }
    })
}

pub use crate::private_files::temporary_sibling;

/// Elements `range` of each 1-D tensor of `names`, each `len` elements long, in the
/// safetensors file `path`, read without loading the rest of the file (it is mapped, and its
/// header checked against its length first). A missing name, another shape, a range past the
/// end or a byte-sized dtype misfit is an error naming the file and the tensor.
pub fn read_flat_ranges(
    path: &Path,
    names: &[String],
    len: usize,
    range: std::ops::Range<usize>,
) -> Result<Vec<Tensor>> {
    use candle_core::safetensors::Load;
    let damaged = |reason: String| TensorError::DamagedFile {
        file: path.into(),
        reason,
    };
    let io = |source| TensorError::Io {
        file: path.into(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: as in `check_file`: written once and renamed into place, only read here.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    let tensors =
        safetensors::SafeTensors::deserialize(&map).map_err(|e| damaged(e.to_string()))?;
    if range.start > range.end || range.end > len {
        return Err(damaged(format!("elements {range:?} of {len}")));
    }
    names
        .iter()
        .map(|name| {
            let view = tensors
                .tensor(name)
                .map_err(|e| damaged(format!("tensor {name:?}: {e}")))?;
            if view.shape() != [len] {
                let shape = view.shape();
                return Err(damaged(format!(
                    "tensor {name:?} has shape {shape:?}, not [{len}]"
                )));
            }
            let bits = view.dtype().bitsize();
            if bits % 8 != 0 {
                return Err(damaged(format!(
                    "tensor {name:?}: dtype {:?}",
                    view.dtype()
                )));
            }
            let bytes = &view.data()[range.start * bits / 8..range.end * bits / 8];
            let part = safetensors::tensor::TensorView::new(view.dtype(), vec![range.len()], bytes)
                .map_err(|e| damaged(format!("tensor {name:?}: {e}")))?;
            part.load(&candle_core::Device::Cpu)
                .map_err(|source| TensorError::Safetensors {
                    file: path.into(),
                    source,
                })
        })
        .collect()
}

/// Checks that `path` is a whole safetensors file without reading its tensors: its header
/// parses, every tensor's bytes match its dtype and shape, and the file is as long as the header
/// says (a truncated or padded file is refused). The error names the file and what is wrong.
pub fn check_file(path: &Path) -> Result<()> {
    let io = |source| TensorError::Io {
        file: path.into(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: a checkpoint's files are written once under a temporary name and renamed into
    // place, never modified where they lie; the map is only read, and dropped on return.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    safetensors::SafeTensors::read_metadata(&map)
        .map(|_| ())
        .map_err(|e| TensorError::DamagedFile {
            file: path.into(),
            reason: e.to_string(),
        })
}

/// Loads `path` into `store`; every key must match an entry in name, shape and dtype.
pub fn load_safetensors(store: &ParamStore, path: &Path) -> Result<()> {
    let all: Vec<EntryId> = (0..store.len()).collect();
    load_safetensors_entries(store, path, &all)
}

/// Loads `path` into the entries `ids` of `store` only (a sharded checkpoint's buffers, whose
/// parameters are in the shards): every key must name one of them, in shape and dtype, and
/// each of them must be in the file.
pub fn load_safetensors_entries(store: &ParamStore, path: &Path, ids: &[EntryId]) -> Result<()> {
    if !path.exists() {
        return Err(TensorError::Io {
            file: path.into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        });
    }
    let loaded = candle_core::safetensors::load(path, store.device()).map_err(|source| {
        TensorError::Safetensors {
            file: path.into(),
            source,
        }
    })?;
    load_into(store, ids, path, &loaded, |_, value| Ok(value.clone()))
}

/// Loads the safetensors bytes `bytes` (named `origin` in errors) into `store`, as
/// [`load_safetensors`] loads a file.
pub fn load_safetensors_bytes(store: &ParamStore, origin: &Path, bytes: &[u8]) -> Result<()> {
    let loaded =
        candle_core::safetensors::load_buffer(bytes, store.device()).map_err(|source| {
            TensorError::Safetensors {
                file: origin.into(),
                source,
            }
        })?;
    let all: Vec<EntryId> = (0..store.len()).collect();
    load_into(store, &all, origin, &loaded, |_, value| Ok(value.clone()))
}

/// Sets every entry of `store` from `loaded` (read from `path`) by name. `part(id, value)`
/// turns a stored value into what entry `id` holds (a tensor-parallel slice, a dtype
/// conversion). A key no entry has, an entry no key has, or a part whose shape or dtype is not
/// the entry's is an error naming the file and the key; every value is checked before any
/// entry is written, so a refused file leaves the store as it was.
pub fn load_tensors(
    store: &ParamStore,
    path: &Path,
    loaded: &HashMap<String, Tensor>,
    part: impl Fn(EntryId, &Tensor) -> Result<Tensor>,
) -> Result<()> {
    let all: Vec<EntryId> = (0..store.len()).collect();
    load_into(store, &all, path, loaded, part)
}

/// [`load_tensors`] into the entries `ids` only.
fn load_into(
    store: &ParamStore,
    ids: &[EntryId],
    path: &Path,
    loaded: &HashMap<String, Tensor>,
    part: impl Fn(EntryId, &Tensor) -> Result<Tensor>,
) -> Result<()> {
    let mut unexpected: Vec<&String> = loaded
        .keys()
        .filter(|k| store.id(k).map_or(true, |id| !ids.contains(&id)))
        .collect();
    unexpected.sort();
    if let Some(key) = unexpected.first() {
        return Err(TensorError::UnexpectedKey {
            file: path.into(),
            key: (*key).clone(),
        });
    }
    let mut checked = Vec::with_capacity(ids.len());
    for &id in ids {
        let entry = &store.entries()[id];
        let stored = loaded
            .get(&entry.name)
            .ok_or_else(|| TensorError::MissingKey {
                file: path.into(),
                key: entry.name.clone(),
            })?;
        let value = part(id, stored)?;
        if value.dims() != entry.var.dims() {
            return Err(TensorError::ShapeMismatch {
                file: path.into(),
                key: entry.name.clone(),
                expected: entry.var.dims().to_vec(),
                found: value.dims().to_vec(),
            });
        }
        if value.dtype() != entry.var.dtype() {
            return Err(TensorError::DTypeMismatch {
                file: path.into(),
                key: entry.name.clone(),
                expected: entry.var.dtype(),
                found: value.dtype(),
            });
        }
        checked.push((id, value));
    }
    for (id, value) in checked {
        store.entries()[id].var.set(&value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::EntryKind;
    use candle_core::{DType, Device};

    /// A parameter name and its shape.
    type Named<'a> = (&'a str, &'a [usize]);

    fn store_with(names: &[Named]) -> ParamStore {
        let mut store = ParamStore::new(&Device::Cpu, DType::F32);
        for (i, (name, shape)) in names.iter().enumerate() {
            let n: usize = shape.iter().product();
            let values: Vec<f32> = (0..n).map(|k| (k + 10 * i) as f32).collect();
            let t = Tensor::from_vec(values, *shape, &Device::Cpu).unwrap();
            store.register(name, EntryKind::Parameter, t).unwrap();
        }
        store
    }

    #[test]
    fn round_trip_restores_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let a = store_with(&[("w", &[2, 3]), ("b", &[3])]);
        save_safetensors(&a, &path).unwrap();
        let b = store_with(&[("w", &[2, 3]), ("b", &[3])]);
        b.get("w")
            .unwrap()
            .var
            .set(&Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap())
            .unwrap();
        load_safetensors(&b, &path).unwrap();
        let w: Vec<f32> = b
            .get("w")
            .unwrap()
            .tensor()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(w, vec![0., 1., 2., 3., 4., 5.]);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary left"
        );
    }

    #[test]
    fn mismatches_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        save_safetensors(&store_with(&[("w", &[2, 3]), ("b", &[3])]), &path).unwrap();
        let cases: [(&[Named], &str); 3] = [
            (
                &[("w", &[2, 3]), ("b", &[3]), ("c", &[1])],
                "missing key `c`",
            ),
            (&[("w", &[2, 3])], "unexpected key `b`"),
            (&[("w", &[3, 2]), ("b", &[3])], "key `w` has shape [2, 3]"),
        ];
        for (names, expected) in cases {
            let err = load_safetensors(&store_with(names), &path)
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{err} lacks {expected}");
        }
        let mut f64_store = ParamStore::new(&Device::Cpu, DType::F64);
        f64_store
            .register(
                "w",
                EntryKind::Parameter,
                Tensor::zeros((2, 3), DType::F64, &Device::Cpu).unwrap(),
            )
            .unwrap();
        f64_store
            .register(
                "b",
                EntryKind::Parameter,
                Tensor::zeros(3, DType::F64, &Device::Cpu).unwrap(),
            )
            .unwrap();
        let err = load_safetensors(&f64_store, &path).unwrap_err().to_string();
        assert!(err.contains("key `w` has dtype F32"), "{err}");
    }

    /// A file whose first entry fits and whose second does not is refused without writing
    /// the first: the store keeps its values.
    #[test]
    fn a_refused_file_leaves_every_entry_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let saved = store_with(&[("a", &[2]), ("z", &[3])]);
        saved
            .get("a")
            .unwrap()
            .var
            .set(&Tensor::new(&[7f32, 8.], &Device::Cpu).unwrap())
            .unwrap();
        save_safetensors(&saved, &path).unwrap();
        let target = store_with(&[("a", &[2]), ("z", &[4])]);
        let err = load_safetensors(&target, &path).unwrap_err().to_string();
        assert!(err.contains("key `z` has shape [3]"), "{err}");
        let a: Vec<f32> = target.get("a").unwrap().tensor().to_vec1().unwrap();
        assert_eq!(a, vec![0., 1.], "the first entry was overwritten");
    }

    #[test]
    fn missing_and_corrupt_files_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with(&[("w", &[1])]);
        let missing = dir.path().join("nope.safetensors");
        assert!(load_safetensors(&store, &missing)
            .unwrap_err()
            .to_string()
            .contains("nope.safetensors"));
        let corrupt = dir.path().join("bad.safetensors");
        std::fs::write(&corrupt, b"garbage").unwrap();
        assert!(check_file(&corrupt).is_err());
        assert!(load_safetensors(&store, &corrupt)
            .unwrap_err()
            .to_string()
            .contains("bad.safetensors"));
    }

    #[test]
    fn a_truncated_or_padded_file_is_damaged_and_a_whole_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        save_safetensors(&store_with(&[("w", &[3, 4]), ("b", &[4])]), &path).unwrap();
        check_file(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        for damaged in [&bytes[..bytes.len() - 1], &[&bytes[..], &[0]].concat()[..]] {
            std::fs::write(&path, damaged).unwrap();
            let err = check_file(&path).unwrap_err().to_string();
            assert!(
                err.contains("model.safetensors: not a whole safetensors file"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_flat_range_is_read_alone_and_bad_requests_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard.safetensors");
        let values: Vec<f32> = (0..10).map(|v| v as f32).collect();
        let flat = Tensor::from_vec(values, 10, &Device::Cpu).unwrap();
        let tensors = HashMap::from([("exp_avg".to_string(), flat)]);
        save_tensors(&tensors, &path).unwrap();
        let names = ["exp_avg".to_string()];
        let part = read_flat_ranges(&path, &names, 10, 3..7).unwrap();
        assert_eq!(part[0].to_vec1::<f32>().unwrap(), [3.0, 4.0, 5.0, 6.0]);
        for (names, len, range, says) in [
            (vec!["nope".to_string()], 10, 0..1, "tensor \"nope\""),
            (names.to_vec(), 12, 0..1, "has shape [10], not [12]"),
            (names.to_vec(), 10, 8..11, "elements 8..11 of 10"),
        ] {
            let err = read_flat_ranges(&path, &names, len, range)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("shard.safetensors") && err.contains(says),
                "{err}"
            );
        }
    }
}
