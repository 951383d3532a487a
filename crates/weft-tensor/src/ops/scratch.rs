//! Per-thread scratch buffers that the convolution kernels reuse across calls, so that
//! their multi-megabyte column matrices are not freshly allocated (and page-faulted in)
//! on every call.

use super::storage::Float;
use std::cell::RefCell;

/// Two growable buffers (column matrix and gathered rows), stored as `u64` words so one
/// allocation serves f32 and f64 alike.
#[derive(Default)]
pub(crate) struct Scratch {
    cols: Vec<u64>,
    rows: Vec<u64>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

impl Scratch {
    /// Runs `f` with this thread's scratch, or with a fresh one when this thread's is
    /// already in use further up the stack (rayon may run another task on a thread that
    /// waits inside a parallel GEMM).
    pub(crate) fn with<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => f(&mut scratch),
            Err(_) => f(&mut Scratch::default()),
        })
    }

    /// Both buffers as `T` slices of (at least) the given lengths; contents are unspecified.
    pub(crate) fn buffers<T: Float>(&mut self, cols: usize, rows: usize) -> (&mut [T], &mut [T]) {
        (
            words_as::<T>(&mut self.cols, cols),
            words_as::<T>(&mut self.rows, rows),
        )
    }
}

/// `words` grown to hold `len` values of `T`, viewed as such.
fn words_as<T: Float>(words: &mut Vec<u64>, len: usize) -> &mut [T] {
    let needed = (len * std::mem::size_of::<T>()).div_ceil(8);
    if words.len() < needed {
        words.resize(needed, 0);
    }
    &mut bytemuck::cast_slice_mut::<u64, T>(words)[..len]
}
