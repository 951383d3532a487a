//! Crash-durable writes: a file is written under a temporary name next to its target
//! ([`temporary_sibling`]), flushed to the disk (`fsync`), renamed into place, and its folder
//! flushed, so that after a crash or a power cut the target holds either its old bytes or all of
//! its new ones, never a prefix, and the rename itself is not lost. A folder renamed into place
//! (a checkpoint staged as `DIR.partial`) gets the same: its files and itself flushed first, the
//! folder holding it after.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

use crate::private_files::temporary_sibling;

/// Flushes the file or folder `path` to the disk.
pub fn sync_path(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

/// Flushes the folder holding `path` (its entry for `path`).
pub fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => sync_path(parent),
        _ => sync_path(Path::new(".")),
    }
}

/// Writes `bytes` to `path` durably: a temporary sibling written and flushed, renamed over
/// `path`, the folder flushed. On an error the temporary file is removed and `path` is as it
/// was.
pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = temporary_sibling(path);
    let written = File::create(&tmp).and_then(|mut file| {
        file.write_all(bytes)?;
        file.sync_all()
    });
    match written {
        Ok(()) => rename(&tmp, path),
        Err(err) => {
            let _ = std::fs::remove_file(&tmp);
            Err(err)
        }
    }
}

/// Renames the written file or folder `from` to `to` durably: `from` flushed (a folder's files
/// and folders inside it first, to any depth), renamed, the folder holding `to` flushed.
pub fn rename(from: &Path, to: &Path) -> io::Result<()> {
    sync_tree(from)?;
    std::fs::rename(from, to)?;
    sync_parent(to)
}

/// Flushes `path`, and when it is a folder, everything in it first.
fn sync_tree(path: &Path) -> io::Result<()> {
    if std::fs::symlink_metadata(path)?.is_dir() {
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            if !entry.file_type()?.is_symlink() {
                sync_tree(&entry.path())?;
            }
        }
    }
    sync_path(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_durable_write_replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("progress.json");
        write(&path, b"{\"step\": 1}").unwrap();
        write(&path, b"{\"step\": 2}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"step\": 2}");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manifest.json");
        write(&path, b"old").unwrap();
        let missing = dir.path().join("no-such-folder/manifest.json");
        assert!(write(&missing, b"new").is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
    }

    #[test]
    fn a_staged_folder_is_renamed_into_place_with_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let staging = dir.path().join("step-00000002.partial");
        std::fs::create_dir(&staging).unwrap();
        std::fs::create_dir(staging.join("stage-00-of-02")).unwrap();
        write(&staging.join("stage-00-of-02/shard.safetensors"), b"bytes").unwrap();
        let done = dir.path().join("step-00000002");
        rename(&staging, &done).unwrap();
        let shard = done.join("stage-00-of-02/shard.safetensors");
        assert_eq!(std::fs::read(shard).unwrap(), b"bytes");
        assert!(!staging.exists());
    }
}
