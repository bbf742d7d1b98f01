//! How long each kernel of this vGPU usually runs (its backend call, from the grant to the
//! completion noticed: the launch, the device time and the host's notice of the end): the
//! estimate a launch hands its grant request, so vgpud can be ready for the completion (its thread polling and the next
//! vGPU's worker awake) instead of waking twice after it. A hint only: nothing is
//! accounted or decided by it, and a wrong estimate costs a short spin.

use std::sync::atomic::{AtomicU64, Ordering};

/// Kernels remembered; a function handle shares its slot with others of the same hash
/// (the newest wins).
const SLOTS: usize = 64;

/// Backend-call time per kernel function: a running average over its launches.
pub struct KernelTimes {
    /// (function handle + 1, 0 when empty; average time, ns).
    slots: [(AtomicU64, AtomicU64); SLOTS],
}

impl Default for KernelTimes {
    fn default() -> Self {
        Self {
            slots: std::array::from_fn(|_| (AtomicU64::new(0), AtomicU64::new(0))),
        }
    }
}

fn slot(function: u64) -> usize {
    // Fibonacci hashing of the handle ((module << 16) | index); the top bits pick the slot.
    (function.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize % SLOTS
}

impl KernelTimes {
    /// The usual time of `function`, ns (0: not seen yet).
    pub fn expect(&self, function: u64) -> u64 {
        let (key, ns) = &self.slots[slot(function)];
        if key.load(Ordering::Relaxed) == function.wrapping_add(1) {
            ns.load(Ordering::Relaxed)
        } else {
            0
        }
    }

    /// A launch of `function` took `ns`.
    #[cfg(test)]
    pub fn record(&self, function: u64, ns: u64) {
        self.record_n(function, ns, 1);
    }

    /// `n` launches of `function` in a row took `ns` each: as `n` calls of
    /// [`KernelTimes::record`], with one update of the shared slot (a batch's launches
    /// would otherwise write it once each while the queue thread reads it).
    pub fn record_n(&self, function: u64, ns: u64, n: usize) {
        if n == 0 {
            return;
        }
        let (key, avg) = &self.slots[slot(function)];
        let k = function.wrapping_add(1);
        let (mut v, steps) = if key.swap(k, Ordering::Relaxed) == k {
            (avg.load(Ordering::Relaxed), n)
        } else {
            (ns, n - 1)
        };
        // Three quarters of the average and a quarter of the new time per launch: a kernel
        // whose work changes is followed within a few launches. Past 64 steps the average
        // is the new time.
        for _ in 0..steps.min(64) {
            v = v - v / 4 + ns / 4;
        }
        avg.store(v, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_each_kernel_on_its_own() {
        let t = KernelTimes::default();
        assert_eq!(t.expect(0x1_0001), 0);
        t.record(0x1_0001, 1_000_000);
        t.record(0x1_0002, 10_000);
        assert_eq!(t.expect(0x1_0001), 1_000_000);
        assert_eq!(t.expect(0x1_0002), 10_000);
        t.record(0x1_0001, 2_000_000);
        assert_eq!(t.expect(0x1_0001), 1_250_000);
        assert_eq!(t.expect(0x2_0001), 0, "an unknown kernel has no estimate");
    }

    #[test]
    fn a_run_recorded_at_once_ends_where_its_launches_one_by_one_end() {
        for n in [1, 2, 5, 64, 200] {
            let (one, all) = (KernelTimes::default(), KernelTimes::default());
            for t in [&one, &all] {
                t.record(0x1_0001, 40_000);
            }
            for _ in 0..n {
                one.record(0x1_0001, 1_000);
            }
            all.record_n(0x1_0001, 1_000, n);
            assert_eq!(all.expect(0x1_0001), one.expect(0x1_0001), "{n} launches");
            // A kernel not seen before starts at its first time.
            let fresh = KernelTimes::default();
            fresh.record_n(0x3_0001, 7_000, n);
            assert_eq!(
                fresh.expect(0x3_0001),
                7_000,
                "{n} launches of a new kernel"
            );
        }
        let t = KernelTimes::default();
        t.record_n(0x1_0001, 5, 0);
        assert_eq!(t.expect(0x1_0001), 0, "no launch records nothing");
    }
}
