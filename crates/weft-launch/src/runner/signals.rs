//! SIGINT, SIGTERM and SIGHUP to the launcher are recorded, to be forwarded to the ranks.

use std::sync::atomic::{AtomicI32, Ordering};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static PENDING: AtomicI32 = AtomicI32::new(0);

extern "C" fn record(signal: libc::c_int) {
    PENDING.store(signal, Ordering::SeqCst);
}

/// Installs the recording handler.
pub fn install() -> Result<(), String> {
    let action = SigAction::new(
        SigHandler::Handler(record),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(signal, &action) }
            .map_err(|e| format!("cannot handle {signal}: {e}"))?;
    }
    Ok(())
}

/// The signal received since the last call, if any.
pub fn take() -> Option<Signal> {
    Signal::try_from(PENDING.swap(0, Ordering::SeqCst)).ok()
}
