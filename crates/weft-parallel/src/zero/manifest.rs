//! The manifest of a sharded checkpoint (`manifest.json`): how the flat buffers were laid out
//! and cut, so that any number of ranks can read them back. The entries give each parameter's
//! place in the flat buffers (name, shape, dtype, offset); the shards give each file's range.
//! A ZeRO-3 run's shard files hold its parameters too ([`Manifest::parameters_in_shards`]).

use std::path::Path;

use serde::{Deserialize, Serialize};
use weft_tensor::FlatLayout;

use crate::error::{ParallelError, Result};

/// The format written by this version.
pub const FORMAT: &str = "weft-sharded-v1";

/// One parameter's place in the flat buffers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    pub name: String,
    pub shape: Vec<usize>,
    pub offset: usize,
}

/// One shard file and the elements of the flat buffers it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestShard {
    pub file: String,
    pub start: usize,
    pub end: usize,
}

/// What a sharded checkpoint holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    /// The optimizer (`sgd`, `adamw`) and its step count.
    pub optimizer: String,
    pub step: u64,
    /// The state buffers each shard file holds, flat over its range.
    pub buffers: Vec<String>,
    /// Whether each shard file holds the master weights over its range too.
    pub master_weights: bool,
    /// Elements of the flat buffers.
    pub flat_len: usize,
    pub entries: Vec<ManifestEntry>,
    pub shards: Vec<ManifestShard>,
    /// The model's parameters and buffers, whole (`model.safetensors`); its buffers only when
    /// the parameters are in the shards.
    pub model_file: String,
    /// Whether each shard file holds the parameters over its range too (a ZeRO-3 run, whose
    /// ranks hold only their shard of them).
    #[serde(default)]
    pub parameters_in_shards: bool,
}

impl Manifest {
    /// The entries of `layout`.
    pub fn entries_of(layout: &FlatLayout) -> Vec<ManifestEntry> {
        layout
            .slots()
            .iter()
            .map(|slot| ManifestEntry {
                name: slot.name.clone(),
                shape: slot.shape.clone(),
                offset: slot.offset,
            })
            .collect()
    }

    /// Reads `dir/manifest.json`.
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join("manifest.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| ParallelError::Checkpoint(format!("{}: {e}", path.display())))?;
        Self::parse(&text, &path)
    }

    /// The manifest in `text` (read from `path`): its format must be this version's, and every
    /// file it names a plain name inside the checkpoint folder (no folder, no `..`), so a
    /// manifest cannot make a load read files elsewhere.
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let fail = |what: String| ParallelError::Checkpoint(format!("{}: {what}", path.display()));
        let manifest: Manifest = serde_json::from_str(text).map_err(|e| fail(e.to_string()))?;
        if manifest.format != FORMAT {
            return Err(fail(format!(
                "format {:?}, this version reads {FORMAT:?}",
                manifest.format
            )));
        }
        let files = manifest.shards.iter().map(|s| (&s.file, "shards[].file"));
        for (file, field) in files.chain([(&manifest.model_file, "model_file")]) {
            let plain = Path::new(file)
                .file_name()
                .is_some_and(|n| n == file.as_str());
            if !plain {
                return Err(fail(format!(
                    "field {field}: {file:?} is not a file name inside the checkpoint folder"
                )));
            }
        }
        manifest.check_ranges().map_err(fail)?;
        Ok(manifest)
    }

    /// Checks that the shards cover the flat buffers in order, each element once, and that
    /// every entry lies inside them: what every reader relies on before it cuts a buffer.
    fn check_ranges(&self) -> std::result::Result<(), String> {
        let mut covered = 0;
        for (i, shard) in self.shards.iter().enumerate() {
            if shard.start != covered || shard.end < shard.start {
                return Err(format!(
                    "field shards[{i}]: elements {}..{} do not continue at element {covered}",
                    shard.start, shard.end
                ));
            }
            covered = shard.end;
        }
        if covered != self.flat_len {
            return Err(format!(
                "field shards: they cover {covered} of flat_len {} elements",
                self.flat_len
            ));
        }
        for (i, entry) in self.entries.iter().enumerate() {
            let numel = entry
                .shape
                .iter()
                .try_fold(1usize, |n, &d| n.checked_mul(d));
            let end = numel.and_then(|n| n.checked_add(entry.offset));
            if end.is_none_or(|end| end > self.flat_len) {
                return Err(format!(
                    "field entries[{i}] ({}): shape {:?} at offset {} ends past flat_len {}",
                    entry.name, entry.shape, entry.offset, self.flat_len
                ));
            }
        }
        Ok(())
    }

    /// Checks that the checkpoint was written for a model laid out as `layout`: the same
    /// parameters, shapes and offsets; the first difference is named (the shards' ranges were
    /// checked when the manifest was read).
    pub fn check_layout(&self, layout: &FlatLayout, dir: &Path) -> Result<()> {
        let mine = Self::entries_of(layout);
        let differ = |what: String| {
            ParallelError::Checkpoint(format!("{}/manifest.json: {what}", dir.display()))
        };
        if let Some((theirs, ours)) = self.entries.iter().zip(&mine).find(|(a, b)| a != b) {
            return Err(differ(format!(
                "parameter {} {:?} at {}, the model has {} {:?} at {}",
                theirs.name, theirs.shape, theirs.offset, ours.name, ours.shape, ours.offset
            )));
        }
        if self.entries.len() != mine.len() || self.flat_len != layout.len() {
            return Err(differ(format!(
                "{} parameters in {} elements, the model has {} in {}",
                self.entries.len(),
                self.flat_len,
                mine.len(),
                layout.len()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest_naming(shard_file: &str, model_file: &str) -> String {
        serde_json::json!({
            "format": FORMAT, "optimizer": "sgd", "step": 1, "buffers": [],
            "master_weights": false, "flat_len": 4,
            "entries": [{"name": "w", "shape": [4], "offset": 0}],
            "shards": [{"file": shard_file, "start": 0, "end": 4}],
            "model_file": model_file,
        })
        .to_string()
    }

    #[test]
    fn a_manifest_naming_files_outside_its_folder_is_refused() {
        let path = Path::new("ckpt/manifest.json");
        assert!(Manifest::parse(
            &manifest_naming("shard-0.safetensors", "model.safetensors"),
            path
        )
        .is_ok());
        for (shard, model, field) in [
            ("../../secret", "model.safetensors", "shards[].file"),
            ("/etc/passwd", "model.safetensors", "shards[].file"),
            ("shard-0.safetensors", "..", "model_file"),
            ("shard-0.safetensors", "sub/model.safetensors", "model_file"),
            ("", "model.safetensors", "shards[].file"),
        ] {
            let err = Manifest::parse(&manifest_naming(shard, model), path)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("ckpt/manifest.json: field ") && err.contains(field),
                "{shard} {model}: {err}"
            );
        }
        let err = Manifest::parse("{\"format\": 3}", path)
            .unwrap_err()
            .to_string();
        assert!(err.contains("ckpt/manifest.json: "), "{err}");
    }

    #[test]
    fn shards_that_leave_a_gap_or_entries_past_the_buffers_are_refused() {
        let path = Path::new("ckpt/manifest.json");
        let with = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut json: serde_json::Value =
                serde_json::from_str(&manifest_naming("s.safetensors", "m.safetensors")).unwrap();
            edit(&mut json);
            Manifest::parse(&json.to_string(), path).map(|_| ())
        };
        with(&|_| {}).unwrap();
        type Edit<'a> = &'a dyn Fn(&mut serde_json::Value);
        let cases: [(Edit, &str); 4] = [
            (&|j| j["shards"][0]["start"] = 1.into(), "field shards[0]"),
            (
                &|j| j["shards"][0]["end"] = 3.into(),
                "field shards: they cover 3",
            ),
            (
                &|j| j["entries"][0]["offset"] = 1.into(),
                "field entries[0] (w)",
            ),
            (
                &|j| j["entries"][0]["shape"] = serde_json::json!([usize::MAX, 2]),
                "field entries[0] (w)",
            ),
        ];
        for (edit, says) in cases {
            let err = with(edit).unwrap_err().to_string();
            assert!(
                err.contains("ckpt/manifest.json") && err.contains(says),
                "{err}"
            );
        }
    }
}
