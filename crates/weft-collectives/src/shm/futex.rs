//! Sleeping on a counter in shared memory until it changes (Linux futexes on the counter's
//! low 32 bits, shared between processes), so a rank that waits long gives its core to the
//! rank it waits for instead of spinning. A writer wakes sleepers only when the counter's
//! sleeper count says there are any.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The 32-bit word of `counter` that changes with every increment.
fn low_word(counter: &AtomicU64) -> *mut u32 {
    let offset = if cfg!(target_endian = "big") { 4 } else { 0 };
    // SAFETY: the offset stays inside the 8-byte atomic.
    unsafe { (counter.as_ptr() as *mut u8).add(offset) as *mut u32 }
}

/// Sleeps until `counter` changes, a wake-up arrives, or `timeout` passes, unless `done()`
/// holds once this thread is registered in `sleepers`. May return early for no reason.
pub(crate) fn sleep_on(
    counter: &AtomicU64,
    sleepers: &AtomicU64,
    done: impl Fn() -> bool,
    timeout: Duration,
) {
    sleepers.fetch_add(1, Ordering::SeqCst);
    let observed = counter.load(Ordering::SeqCst) as u32;
    if !done() {
        let timeout = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: the word lives in a mapping that outlives this call; the kernel only reads it.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                low_word(counter),
                libc::FUTEX_WAIT,
                observed,
                &timeout as *const libc::timespec,
                std::ptr::null::<u32>(),
                0,
            );
        }
    }
    sleepers.fetch_sub(1, Ordering::SeqCst);
}

/// Stores `value` into `counter` and wakes every thread sleeping on it.
pub(crate) fn store_and_wake(counter: &AtomicU64, sleepers: &AtomicU64, value: u64) {
    counter.store(value, Ordering::SeqCst);
    if sleepers.load(Ordering::SeqCst) != 0 {
        // SAFETY: waking has no memory effects; the word is valid for the call.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                low_word(counter),
                libc::FUTEX_WAKE,
                i32::MAX,
                0,
                0,
                0,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn sleepers_wake_when_the_counter_is_stored_and_time_out_otherwise() {
        let (counter, sleepers) = (AtomicU64::new(0), AtomicU64::new(0));
        let start = Instant::now();
        sleep_on(&counter, &sleepers, || false, Duration::from_millis(30));
        assert!(start.elapsed() >= Duration::from_millis(25));
        std::thread::scope(|s| {
            s.spawn(|| {
                while sleepers.load(Ordering::SeqCst) == 0 {
                    std::thread::yield_now();
                }
                store_and_wake(&counter, &sleepers, 1);
            });
            let start = Instant::now();
            while counter.load(Ordering::SeqCst) == 0 {
                sleep_on(
                    &counter,
                    &sleepers,
                    || counter.load(Ordering::SeqCst) != 0,
                    Duration::from_secs(120),
                );
            }
            // Woken by the store, not by the 120 s timeout (a generous bound).
            assert!(start.elapsed() < Duration::from_secs(60));
        });
        assert_eq!(sleepers.load(Ordering::SeqCst), 0);
        let start = Instant::now();
        sleep_on(&counter, &sleepers, || true, Duration::from_secs(120));
        // A condition already true does not sleep out the timeout.
        assert!(start.elapsed() < Duration::from_secs(60));
    }
}
