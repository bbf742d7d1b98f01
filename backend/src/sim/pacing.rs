//! Time on the simulated device: the copy engine's bandwidth and the compute rate.

use crate::sync::lock;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Large copies move in chunks of this size, each paced on its own (Gdev's split
/// transaction), so copies from several queues interleave on the one copy engine.
pub const SPLIT_CHUNK: u64 = 4 << 20;

/// How far behind real time the engine's clock may lag before idle time is forfeited; it
/// absorbs sleep overshoot so long copies average the configured bandwidth.
const SLACK: Duration = Duration::from_micros(500);

/// Below this, waiting spins instead of sleeping (a sleep overshoots by tens of µs).
const SPIN_BELOW: Duration = Duration::from_micros(50);

/// The copy engine: one bandwidth shared by every copy of this device.
#[derive(Debug)]
pub struct CopyEngine {
    bytes_per_sec: u64,
    busy_until: Mutex<Instant>,
}

impl CopyEngine {
    /// An engine moving `bytes_per_sec` (0 = as fast as the host copies).
    pub fn new(bytes_per_sec: u64) -> Self {
        Self {
            bytes_per_sec,
            busy_until: Mutex::new(Instant::now()),
        }
    }

    /// Moves `len` bytes by calling `step(offset, n)` for consecutive chunks, each
    /// finishing no earlier than the engine's bandwidth allows.
    pub fn run<E>(
        &self,
        len: u64,
        mut step: impl FnMut(u64, u64) -> Result<(), E>,
    ) -> Result<(), E> {
        if self.bytes_per_sec == 0 {
            return step(0, len);
        }
        let mut off = 0;
        while off < len {
            let n = (len - off).min(SPLIT_CHUNK);
            let done_at = self.reserve(n);
            step(off, n)?;
            wait_until(done_at);
            off += n;
        }
        Ok(())
    }

    fn reserve(&self, n: u64) -> Instant {
        let nanos = u128::from(n) * 1_000_000_000 / u128::from(self.bytes_per_sec.max(1));
        let dur = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        let now = Instant::now();
        let mut busy = lock(&self.busy_until);
        let floor = now.checked_sub(SLACK).unwrap_or(now);
        let start = (*busy).max(floor);
        let end = start + dur;
        *busy = end;
        end
    }
}

/// Work units per second of a device at speed 1.0 (one unit = one element operation).
pub const UNITS_PER_SEC: f64 = 1e9;

/// The modeled duration of `units` of work at `speed`.
pub fn work_time(units: u64, speed: f64) -> Duration {
    Duration::try_from_secs_f64(units as f64 / (UNITS_PER_SEC * speed)).unwrap_or(Duration::MAX)
}

/// Returns once `t` has passed: sleeps for long waits, spins for short ones.
pub fn wait_until(t: Instant) {
    loop {
        let now = Instant::now();
        if now >= t {
            return;
        }
        let left = t - now;
        if left > SPIN_BELOW {
            std::thread::sleep(left - SPIN_BELOW / 2);
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Busy (never sleeping) until `t`: the non-preemptive burst of the `spin` kernel.
pub fn spin_until(t: Instant) {
    while Instant::now() < t {
        std::hint::spin_loop();
    }
}
