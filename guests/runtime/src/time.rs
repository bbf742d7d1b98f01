//! TSC time. The vmm reports the guest TSC frequency in BootInfo; 0 means unknown, and then
//! only raw cycle counts are honest.

use core::sync::atomic::{AtomicU64, Ordering};

static TSC_KHZ: AtomicU64 = AtomicU64::new(0);

/// Used for timeouts only, never for reported figures, when the vmm could not tell the
/// TSC frequency: high enough that a timeout is never shorter than asked on today's CPUs.
const FALLBACK_TIMEOUT_KHZ: u64 = 5_000_000;

#[cfg_attr(test, allow(dead_code))]
pub(crate) fn init(tsc_khz: u64) {
    TSC_KHZ.store(tsc_khz, Ordering::Relaxed);
}

/// The guest TSC frequency in kHz, if the vmm knew it.
pub fn tsc_khz() -> Option<u64> {
    match TSC_KHZ.load(Ordering::Relaxed) {
        0 => None,
        khz => Some(khz),
    }
}

/// Reads the TSC after all earlier instructions completed (`lfence` keeps `rdtsc` from
/// running ahead of the code being timed).
#[inline(always)]
pub fn rdtsc() -> u64 {
    let lo: u32;
    let hi: u32;
    // SAFETY: lfence and rdtsc read the time stamp counter only; CR4.TSD is clear at CPL 0.
    unsafe {
        core::arch::asm!("lfence", "rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags));
    }
    (u64::from(hi) << 32) | u64::from(lo)
}

/// Converts TSC ticks to nanoseconds, if the frequency is known.
pub fn ticks_to_ns(ticks: u64) -> Option<u64> {
    tsc_khz().map(|khz| (u128::from(ticks) * 1_000_000 / u128::from(khz)) as u64)
}

/// Same as [`ticks_to_ns`], with sub-nanosecond precision for per-iteration figures.
pub fn ticks_to_ns_f64(ticks: f64) -> Option<f64> {
    tsc_khz().map(|khz| ticks * 1_000_000.0 / khz as f64)
}

/// A monotonic nanosecond clock for timeouts (guest-driver's `StreamOptions::now_ns`).
/// Exact when the TSC frequency is known; otherwise it runs slow, so timeouts only
/// lengthen. Never use it for reported figures.
pub fn timeout_clock_ns() -> u64 {
    let khz = tsc_khz().unwrap_or(FALLBACK_TIMEOUT_KHZ);
    (u128::from(rdtsc()) * 1_000_000 / u128::from(khz)) as u64
}

fn ms_to_timeout_ticks(ms: u64) -> u64 {
    let khz = tsc_khz().unwrap_or(FALLBACK_TIMEOUT_KHZ);
    ms.saturating_mul(khz)
}

/// A point in TSC time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Instant(u64);

impl Instant {
    pub fn now() -> Self {
        Instant(rdtsc())
    }

    pub fn ticks(self) -> u64 {
        self.0
    }

    pub fn elapsed_ticks(self) -> u64 {
        rdtsc().saturating_sub(self.0)
    }

    pub fn elapsed_ns(self) -> Option<u64> {
        ticks_to_ns(self.elapsed_ticks())
    }
}

/// A timeout for polling loops, so a dead device yields a diagnostic instead of a hang.
#[derive(Clone, Copy, Debug)]
pub struct Deadline(u64);

impl Deadline {
    pub fn after_ms(ms: u64) -> Self {
        Deadline(rdtsc().saturating_add(ms_to_timeout_ticks(ms)))
    }

    pub fn expired(self) -> bool {
        rdtsc() >= self.0
    }
}

/// Busy-waits for `us` microseconds (approximate when the TSC frequency is unknown).
pub fn delay_us(us: u64) {
    let end = rdtsc().saturating_add(ms_to_timeout_ticks(us) / 1000);
    while rdtsc() < end {
        core::hint::spin_loop();
    }
}
