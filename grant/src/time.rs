//! CLOCK_MONOTONIC in nanoseconds: the one clock the daemon and every worker agree on.

use vgpu_scheduler::Nanos;

/// Nanoseconds on CLOCK_MONOTONIC (the same in every process on the host).
pub fn now() -> Nanos {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always available.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// A `vgpu_scheduler::Clock` on CLOCK_MONOTONIC.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostClock;

impl vgpu_scheduler::Clock for HostClock {
    fn now(&self) -> Nanos {
        now()
    }
}
