//! POSIX shared-memory segments: create (`O_CREAT|O_EXCL`, mode 0600), open, map, unlink,
//! with RAII: the mapping is removed on drop, and a segment this process created is
//! unlinked on drop unless it was unlinked already. Names look like `/weft-<job>-<random>`,
//! so a launcher can remove whatever a killed job left in `/dev/shm`.

use std::num::NonZeroUsize;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::mman::{mmap, munmap, shm_open, shm_unlink, MapFlags, ProtFlags};
use nix::sys::stat::{fstat, Mode};
use rand::Rng;

use crate::error::{CommError, Result};

/// Where Linux shows POSIX shared-memory segments as files.
pub const SHM_DIR: &str = "/dev/shm";

/// A mapped shared-memory segment.
pub(crate) struct Segment {
    name: String,
    ptr: NonNull<u8>,
    len: usize,
    unlink_on_drop: AtomicBool,
}

// SAFETY: the mapping is plain shared memory; all access goes through raw pointers and
// atomics whose synchronisation the users of the segment are responsible for.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

/// Job ids keep only ASCII letters, digits and `_`, so that one job's segment-name prefix
/// `weft-<job>-` can never match another job's segments.
pub fn sanitize_job_id(job_id: &str) -> String {
    let cleaned: String = job_id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(64)
        .collect();
    if cleaned.is_empty() {
        "job".to_string()
    } else {
        cleaned
    }
}

/// File-name prefix (inside [`SHM_DIR`]) of every segment of job `job_id`.
pub fn job_segment_prefix(job_id: &str) -> String {
    format!("weft-{}-", sanitize_job_id(job_id))
}

/// A fresh random segment name for job `job_id`.
pub(crate) fn new_segment_name(job_id: &str) -> String {
    let random: u64 = rand::thread_rng().gen();
    format!("/{}{random:016x}", job_segment_prefix(job_id))
}

/// Unlinks every segment of job `job_id` still present, returning their names.
pub fn remove_job_segments(job_id: &str) -> std::io::Result<Vec<String>> {
    let prefix = job_segment_prefix(job_id);
    let mut removed = Vec::new();
    for entry in std::fs::read_dir(SHM_DIR)? {
        let file_name = entry?.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        if file_name.starts_with(&prefix) {
            let name = format!("/{file_name}");
            // Another process may have unlinked it meanwhile; that is fine.
            if shm_unlink(name.as_str()).is_ok() {
                removed.push(name);
            }
        }
    }
    Ok(removed)
}

impl Segment {
    /// Creates segment `name` of `len` bytes (zero-filled) and maps it. Fails if it exists.
    pub(crate) fn create(name: &str, len: usize) -> Result<Segment> {
        let flags = OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR;
        let fd = shm_open(name, flags, Mode::S_IRUSR | Mode::S_IWUSR)
            .map_err(|e| shm_error(name, "shm_open(O_CREAT|O_EXCL)", e))?;
        let unlink_guard = UnlinkGuard(name);
        nix::unistd::ftruncate(&fd, len as i64).map_err(|e| shm_error(name, "ftruncate", e))?;
        // Reserve the memory now: a full /dev/shm then fails here instead of raising SIGBUS later.
        match nix::fcntl::posix_fallocate(fd.as_raw_fd(), 0, len as i64) {
            Ok(()) | Err(Errno::EOPNOTSUPP) | Err(Errno::EINVAL) => {}
            Err(e) => return Err(shm_error(name, "posix_fallocate", e)),
        }
        let ptr = map(name, &fd, len)?;
        std::mem::forget(unlink_guard);
        Ok(Segment {
            name: name.to_string(),
            ptr,
            len,
            unlink_on_drop: AtomicBool::new(true),
        })
    }

    /// Opens and maps the existing segment `name`, whatever its size.
    pub(crate) fn open(name: &str) -> Result<Segment> {
        let fd = shm_open(name, OFlag::O_RDWR, Mode::empty())
            .map_err(|e| shm_error(name, "shm_open", e))?;
        let stat = fstat(fd.as_raw_fd()).map_err(|e| shm_error(name, "fstat", e))?;
        let len = usize::try_from(stat.st_size).unwrap_or(0);
        let ptr = map(name, &fd, len)?;
        Ok(Segment {
            name: name.to_string(),
            ptr,
            len,
            unlink_on_drop: AtomicBool::new(false),
        })
    }

    /// Removes the name so no other process can open it; existing mappings stay valid.
    /// Only the first call on the creating process unlinks; later calls do nothing.
    pub(crate) fn unlink(&self) -> Result<()> {
        if self.unlink_on_drop.swap(false, Ordering::AcqRel) {
            shm_unlink(self.name.as_str()).map_err(|e| shm_error(&self.name, "shm_unlink", e))?;
        }
        Ok(())
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; nothing uses them after drop.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
        if self.unlink_on_drop.load(Ordering::Acquire) {
            let _ = shm_unlink(self.name.as_str());
        }
    }
}

/// Unlinks a just-created segment if setting it up fails half-way.
struct UnlinkGuard<'a>(&'a str);

impl Drop for UnlinkGuard<'_> {
    fn drop(&mut self) {
        let _ = shm_unlink(self.0);
    }
}

fn map(name: &str, fd: &OwnedFd, len: usize) -> Result<NonNull<u8>> {
    let length = NonZeroUsize::new(len).ok_or_else(|| CommError::SegmentInvalid {
        name: name.to_string(),
        reason: "the segment is empty".to_string(),
    })?;
    let prot = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
    // SAFETY: a fresh shared mapping of an fd we own; no existing memory is affected.
    let ptr = unsafe { mmap(None, length, prot, MapFlags::MAP_SHARED, fd, 0) }
        .map_err(|e| shm_error(name, "mmap", e))?;
    Ok(ptr.cast())
}

fn shm_error(name: &str, action: &'static str, source: Errno) -> CommError {
    CommError::Shm {
        name: name.to_string(),
        action,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn exists(name: &str) -> bool {
        Path::new(SHM_DIR)
            .join(name.trim_start_matches('/'))
            .exists()
    }

    #[test]
    fn created_segments_are_shared_private_and_unlinked_on_drop() {
        let name = new_segment_name("segment test");
        assert!(name.starts_with("/weft-segment_test-"), "{name}");
        let created = Segment::create(&name, 8192).unwrap();
        let mode = std::fs::metadata(Path::new(SHM_DIR).join(&name[1..])).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
        assert!(matches!(
            Segment::create(&name, 8192),
            Err(CommError::Shm {
                source: Errno::EEXIST,
                ..
            })
        ));
        let opened = Segment::open(&name).unwrap();
        assert_eq!(opened.len(), 8192);
        // SAFETY: both mappings are 8192 bytes long and only this thread uses them.
        unsafe {
            created.base().add(100).write(42);
            assert_eq!(opened.base().add(100).read(), 42);
        }
        drop(opened);
        assert!(exists(&name));
        drop(created);
        assert!(!exists(&name));
    }

    #[test]
    fn unlink_is_idempotent_and_job_segments_can_be_swept() {
        let job = format!("sweep{}", std::process::id());
        let first = Segment::create(&new_segment_name(&job), 4096).unwrap();
        first.unlink().unwrap();
        first.unlink().unwrap();
        assert!(!exists(first.name()));
        let leaked = Segment::create(&new_segment_name(&job), 4096).unwrap();
        let leaked_name = leaked.name().to_string();
        std::mem::forget(leaked);
        let other_job = Segment::create(&new_segment_name(&format!("{job}x")), 4096).unwrap();
        assert_eq!(
            remove_job_segments(&job).unwrap(),
            vec![leaked_name.clone()]
        );
        assert!(!exists(&leaked_name) && exists(other_job.name()));
        assert!(matches!(
            Segment::open("/weft-no-such-segment"),
            Err(CommError::Shm { .. })
        ));
    }
}
