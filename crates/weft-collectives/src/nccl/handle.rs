//! [`CommHandle`]: one raw NCCL communicator, over cudarc's `result`/`sys` layers, because
//! cudarc's safe `Comm` has no split, no async-error query and no abort.
//!
//! NCCL allows a communicator to be used from any thread. weft issues operations from one
//! launcher thread and only queries or aborts from the watchdog thread, which NCCL documents
//! as safe while operations are in flight.

use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::nccl::{result, sys};

use crate::error::{CommError, Result};

/// Turns an NCCL status into a [`CommError::Nccl`] naming the call and the rank.
pub(crate) fn check(
    op: &'static str,
    rank: usize,
    status: std::result::Result<result::NcclStatus, result::NcclError>,
) -> Result<()> {
    status.map(|_| ()).map_err(|error| CommError::Nccl {
        op,
        rank,
        reason: describe(error.0),
    })
}

fn describe(code: sys::ncclResult_t) -> String {
    use sys::ncclResult_t::*;
    let meaning = match code {
        ncclUnhandledCudaError => "a CUDA call failed",
        ncclSystemError => "a system call failed (network, shared memory or a peer's process)",
        ncclInternalError => "internal NCCL error",
        ncclInvalidArgument => "invalid argument",
        ncclInvalidUsage => "invalid usage (mismatched collectives across ranks?)",
        ncclRemoteError => "a remote peer failed or disconnected",
        _ => "error",
    };
    format!("{meaning} ({code:?})")
}

/// The 128-byte id that rank 0 creates and every rank passes to `ncclCommInitRank`.
pub(crate) fn unique_id() -> Result<Vec<u8>> {
    let id = result::get_uniqueid().map_err(|e| CommError::Nccl {
        op: "get_unique_id",
        rank: 0,
        reason: describe(e.0),
    })?;
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

/// A raw NCCL communicator; destroyed on drop unless it was aborted.
pub(crate) struct CommHandle {
    raw: sys::ncclComm_t,
    rank: usize,
    aborted: AtomicBool,
}

// SAFETY: NCCL communicators are not tied to a thread. Launches happen on one thread;
// `async_error` and `abort` are the calls NCCL allows from another thread meanwhile.
unsafe impl Send for CommHandle {}
unsafe impl Sync for CommHandle {}

impl CommHandle {
    /// `ncclCommInitRank`: blocks until all `world_size` ranks have joined with `id`. The
    /// CUDA context of the device must be current on the calling thread.
    pub(crate) fn init(world_size: usize, id: &[u8], rank: usize) -> Result<Self> {
        let mut unique = sys::ncclUniqueId { internal: [0; 128] };
        if id.len() != unique.internal.len() {
            return Err(CommError::InvalidArgument {
                op: "init",
                reason: format!("the NCCL id from the store has {} bytes, not 128", id.len()),
            });
        }
        for (target, &byte) in unique.internal.iter_mut().zip(id) {
            *target = byte as _;
        }
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the id is a well-formed ncclUniqueId.
        let status =
            unsafe { result::comm_init_rank(&mut raw, world_size as i32, unique, rank as i32) };
        check("init", rank, status)?;
        Ok(Self {
            raw,
            rank,
            aborted: AtomicBool::new(false),
        })
    }

    /// `ncclCommSplit` (a collective over this communicator): ranks with the same `color`
    /// form a new communicator, ordered by `key`.
    pub(crate) fn split(&self, color: i32, key: i32, new_rank: usize) -> Result<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: live communicator; a null config makes the child inherit the parent's.
        let status = unsafe {
            sys::ncclCommSplit(self.raw, color, key, &mut raw, std::ptr::null_mut()).result()
        };
        check("split", self.rank, status)?;
        Ok(Self {
            raw,
            rank: new_rank,
            aborted: AtomicBool::new(false),
        })
    }

    pub(crate) fn raw(&self) -> sys::ncclComm_t {
        self.raw
    }

    /// `ncclCommGetAsyncError`: an error raised by NCCL's own threads (a peer that went away,
    /// a network failure) since the last call.
    pub(crate) fn async_error(&self) -> Result<()> {
        if self.aborted.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut code = sys::ncclResult_t::ncclSuccess;
        // SAFETY: live communicator, valid out-pointer.
        let status = unsafe { sys::ncclCommGetAsyncError(self.raw, &mut code).result() };
        check("get_async_error", self.rank, status)?;
        check("async error", self.rank, code.result())
    }

    /// `ncclCommAbort`: frees the communicator and makes operations blocked in it return.
    /// Idempotent.
    pub(crate) fn abort(&self) {
        if !self.aborted.swap(true, Ordering::AcqRel) {
            // SAFETY: live communicator, aborted at most once.
            let _ = unsafe { result::comm_abort(self.raw) };
        }
    }
}

impl Drop for CommHandle {
    fn drop(&mut self) {
        if !self.aborted.load(Ordering::Acquire) {
            // SAFETY: live communicator; no operation is in flight once the owner drops it.
            let _ = unsafe { result::comm_destroy(self.raw) };
        }
    }
}
