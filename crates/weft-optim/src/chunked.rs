//! Runs an element-wise kernel over flat buffers, split into contiguous chunks on scoped
//! threads when the buffers are large. Chunking never changes results: every element is
//! updated by the same arithmetic whichever chunk it lands in.

use std::num::NonZeroUsize;
use std::thread;

/// Buffers shorter than this are updated on the calling thread.
const PARALLEL_MIN_LEN: usize = 1 << 20;
/// No thread gets fewer elements than this.
const MIN_CHUNK_LEN: usize = 1 << 18;

/// A set of equally long buffers (params, grads, state) that can be split at an element index.
pub(crate) trait Lanes: Send + Sized {
    fn len(&self) -> usize;
    fn split_at(self, mid: usize) -> (Self, Self);
}

/// Runs `kernel` over `lanes`, in parallel chunks when they hold at least `PARALLEL_MIN_LEN`
/// elements.
pub(crate) fn run_chunked<L: Lanes>(lanes: L, kernel: impl Fn(L) + Sync) {
    let threads = thread_count(lanes.len());
    run_on_threads(lanes, threads, &kernel);
}

fn thread_count(len: usize) -> usize {
    if len < PARALLEL_MIN_LEN {
        return 1;
    }
    let cores = thread::available_parallelism().map_or(1, NonZeroUsize::get);
    cores.min(len / MIN_CHUNK_LEN).max(1)
}

/// Splits `lanes` into `threads` contiguous chunks; the last runs on the calling thread.
fn run_on_threads<L: Lanes>(lanes: L, threads: usize, kernel: &(impl Fn(L) + Sync)) {
    if threads <= 1 || lanes.len() < 2 {
        kernel(lanes);
        return;
    }
    let chunk = lanes.len().div_ceil(threads);
    thread::scope(|scope| {
        let mut rest = lanes;
        while rest.len() > chunk {
            let (head, tail) = rest.split_at(chunk);
            scope.spawn(move || kernel(head));
            rest = tail;
        }
        kernel(rest);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Indices<'a>(&'a mut [usize], usize);

    impl Lanes for Indices<'_> {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn split_at(self, mid: usize) -> (Self, Self) {
            let (head, tail) = self.0.split_at_mut(mid);
            (Indices(head, self.1), Indices(tail, self.1 + mid))
        }
    }

    fn touch_each(lanes: Indices<'_>) {
        for (i, slot) in lanes.0.iter_mut().enumerate() {
            *slot += lanes.1 + i + 1;
        }
    }

    #[test]
    fn every_element_is_updated_once_at_its_own_index() {
        for (len, threads) in [(0, 4), (1, 4), (7, 3), (10, 4), (100, 7), (5, 16)] {
            let mut seen = vec![0usize; len];
            run_on_threads(Indices(&mut seen, 0), threads, &touch_each);
            let expected: Vec<usize> = (1..=len).collect();
            assert_eq!(seen, expected, "len {len}, threads {threads}");
        }
    }

    #[test]
    fn small_buffers_stay_on_one_thread() {
        assert_eq!(thread_count(0), 1);
        assert_eq!(thread_count(PARALLEL_MIN_LEN - 1), 1);
    }
}
