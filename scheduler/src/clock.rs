//! Time for the schedulers: nanoseconds from an arbitrary origin, real or virtual.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Nanoseconds.
pub type Nanos = u64;

pub const US: Nanos = 1_000;
pub const MS: Nanos = 1_000_000;

/// A source of the current time.
pub trait Clock: Send + Sync {
    fn now(&self) -> Nanos;
}

/// Real time since the clock was made.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock(Instant);

impl MonotonicClock {
    pub fn new() -> Self {
        Self(Instant::now())
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Nanos {
        self.0.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64
    }
}

/// Time that moves only when told to: tests and the simulator.
#[derive(Clone, Debug, Default)]
pub struct VirtualClock(Arc<AtomicU64>);

impl VirtualClock {
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward to `t` (never backward).
    pub fn advance_to(&self, t: Nanos) {
        self.0.fetch_max(t, Ordering::SeqCst);
    }

    pub fn advance(&self, d: Nanos) {
        self.0.fetch_add(d, Ordering::SeqCst);
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Nanos {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_time_only_moves_forward() {
        let c = VirtualClock::new();
        c.advance(5);
        c.advance_to(3);
        assert_eq!(c.now(), 5);
        c.advance_to(10);
        assert_eq!(c.now(), 10);
    }

    #[test]
    fn monotonic_clock_moves() {
        let c = MonotonicClock::new();
        let a = c.now();
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert!(c.now() > a);
    }
}
