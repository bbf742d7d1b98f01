//! Waiting on and waking a 32-bit word in memory shared between processes.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `*word == expected`, at most `timeout`. Spurious wake-ups are fine: the
/// caller re-checks. True when it was woken (or the word had changed), false when the
/// timeout passed.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) -> bool {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned 32-bit atomic (in a shared mapping that outlives the
    // call); FUTEX_WAIT only reads it. `ts` is a valid relative timeout. Not FUTEX_PRIVATE:
    // the waker is another process.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            0usize,
            0u32,
        )
    };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ETIMEDOUT)
}

/// Wakes every waiter on `word`.
pub fn wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned 32-bit atomic; FUTEX_WAKE does not access memory
    // beyond using its address as the key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            0usize,
            0usize,
            0u32,
        );
    }
}
