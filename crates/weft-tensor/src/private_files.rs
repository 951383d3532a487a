//! Files and folders only their owner can read. A run's folders are created owner-only (0o700
//! on Unix) in one step that fails when the folder exists already, so no check-then-create
//! race can hand a writer someone else's folder; files written into them inherit that
//! protection. Temporary files, renamed into place for atomic writes, sit next to their target
//! under names nobody can guess (process id and a random number from the OS-seeded hasher),
//! so no one can plant a file or link there first.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::path::{Path, PathBuf};

/// `dir/.name.tmp-<pid>-<random>`: a file in the same folder, so that the final rename is
/// atomic, under an unguessable name.
pub fn temporary_sibling(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let random = hasher.finish();
    path.with_file_name(format!(".{name}.tmp-{}-{random:016x}", std::process::id()))
}

/// Creates the folder `path` owner-only; its parent must exist, and `path` must not (an
/// existing folder is an `AlreadyExists` error, never reused).
pub fn create_private_dir(path: &Path) -> io::Result<()> {
    builder(false).create(path)
}

/// Creates `path` and any missing parents, each one it creates owner-only.
pub fn create_private_dir_all(path: &Path) -> io::Result<()> {
    builder(true).create(path)
}

fn builder(recursive: bool) -> std::fs::DirBuilder {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(recursive);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_names_differ_and_stay_next_to_their_target() {
        let target = Path::new("/some/run/model.safetensors");
        let (a, b) = (temporary_sibling(target), temporary_sibling(target));
        assert_ne!(a, b);
        assert_eq!(a.parent(), target.parent());
        let name = a.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with(".model.safetensors.tmp-"), "{name}");
    }

    #[test]
    fn private_folders_are_owner_only_and_never_reused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a");
        create_private_dir(&dir).unwrap();
        let again = create_private_dir(&dir).unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::AlreadyExists);
        let nested = root.path().join("b/c/d");
        create_private_dir_all(&nested).unwrap();
        #[cfg(unix)]
        for path in [&dir, &nested, &root.path().join("b")] {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", path.display());
        }
    }
}
