//! Signals: SIGTERM/SIGINT become an eventfd write the event loop handles in order, and a
//! real-time signal kicks vCPU threads out of KVM_RUN.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, Ordering};

use libc::{c_int, c_void, siginfo_t};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

static TERM_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_term(_: c_int, _: *mut siginfo_t, _: *mut c_void) {
    let fd = TERM_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let one = 1u64.to_ne_bytes();
        // SAFETY: write(2) is async-signal-safe; `one` is a valid 8-byte buffer and fd is an
        // eventfd kept open for the life of the process (leaked in `install_term`).
        unsafe { libc::write(fd, one.as_ptr().cast(), one.len()) };
    }
}

extern "C" fn on_kick(_: c_int, _: *mut siginfo_t, _: *mut c_void) {}

/// The signal that interrupts a vCPU's KVM_RUN.
pub fn vcpu_kick_signal() -> c_int {
    SIGRTMIN()
}

/// Routes SIGTERM and SIGINT to `evt`. The eventfd is duplicated and kept for the life of
/// the process so a late signal never writes to a reused descriptor.
pub fn install_term(evt: &EventFd) -> std::io::Result<()> {
    let keep = evt.try_clone()?;
    TERM_FD.store(keep.as_raw_fd(), Ordering::SeqCst);
    std::mem::forget(keep);
    for sig in [libc::SIGTERM, libc::SIGINT] {
        register_signal_handler(sig, on_term)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    }
    Ok(())
}

/// Installs the no-op handler for the vCPU kick signal (without one the signal would kill
/// the process).
pub fn install_kick() -> std::io::Result<()> {
    register_signal_handler(vcpu_kick_signal(), on_kick)
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
}
