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
    pub fn record(&self, function: u64, ns: u64) {
        let (key, avg) = &self.slots[slot(function)];
        let k = function.wrapping_add(1);
        if key.swap(k, Ordering::Relaxed) == k {
            // Three quarters of the average and a quarter of the new time: a kernel whose
            // work changes is followed within a few launches.
            let old = avg.load(Ordering::Relaxed);
            avg.store(old - old / 4 + ns / 4, Ordering::Relaxed);
        } else {
            avg.store(ns, Ordering::Relaxed);
        }
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
}
