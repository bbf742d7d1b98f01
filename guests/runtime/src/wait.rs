//! How a payload waits for its vGPU: spin, idle, and come back in time for the end.
//!
//! A wait spins its first [`SPIN_NS`]: most completions come sooner. A longer wait idles
//! its vCPU (port 0xF6, docs/payload-abi.md) after asking the device for an interrupt at
//! its completion. Coming back from an idle costs the vCPU thread's wake-up and the return
//! into the guest (tens of microseconds on a nested host), which a closed loop would pay
//! after every long kernel, between the kernel's end and its next request. So the runtime
//! learns how long its long waits last and how late an idle comes back beyond what it
//! asked, idles until a lead before a wait's expected end (one and a half times that
//! lateness, plus [`LEAD_MIN_NS`]), and spins through the end, where a completion is seen
//! within a microsecond. A wait that outlasts its expected end by its spin window (3/8 of
//! the expected length, from [`SPIN_WINDOW_NS`] to [`SPIN_WINDOW_MAX_NS`]) idles again,
//! [`IDLE_US`] at a time, until the device's interrupt ends the idle. The window grows
//! with the wait because so does the lateness of the guest's own kernel: on a shared GPU
//! the first kernel after a switch between two tenants' contexts runs about a quarter
//! longer than alone.
//!
//! The expected length is the shortest of the last [`KEPT`] long waits. A closed loop's
//! waits repeat, but on a shared GPU some of them also wait for another tenant's kernel
//! first, for a time no guest can foresee: an average would land between the two and miss
//! both, while the shortest catches every wait for the guest's own kernel alone, and a
//! longer one costs the spin window before its vCPU idles again.

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// How long a wait spins before its vCPU idles.
pub const SPIN_NS: u64 = 50_000;
/// The longest idle the vmm grants one request (µs).
pub const IDLE_US: u32 = 1000;
/// The least lead before a wait's expected end.
pub const LEAD_MIN_NS: u64 = 10_000;
/// The most lead: an idle that comes back later than this is not worth spinning for.
pub const LEAD_MAX_NS: u64 = 200_000;
/// How long past its expected end a wait keeps spinning, at least ...
pub const SPIN_WINDOW_NS: u64 = 100_000;
/// ... and at most.
pub const SPIN_WINDOW_MAX_NS: u64 = 500_000;
/// How many of the last long waits the expected length is taken from.
pub const KEPT: usize = 8;

/// What a waiting stream does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Poll again at once.
    Spin,
    /// Idle the vCPU up to this many µs (a device interrupt ends it sooner).
    Idle(u32),
}

/// What the runtime learned of its waits. Atomics, so one static serves every stream.
#[derive(Debug)]
pub struct WaitClock {
    /// The last long waits (ns; 0: none yet), a ring.
    waits: [AtomicU64; KEPT],
    /// Where the next long wait goes in `waits`.
    next: AtomicUsize,
    /// How late an idle comes back beyond what it asked (ns, averaged).
    late_ns: AtomicU64,
}

impl Default for WaitClock {
    fn default() -> Self {
        Self::new()
    }
}

/// `(3 * old + new) / 4`, or `new` when nothing was learned yet.
fn average(old: &AtomicU64, new: u64) {
    let old_v = old.load(Ordering::Relaxed);
    let v = if old_v == 0 {
        new
    } else {
        (old_v.saturating_mul(3)).saturating_add(new) / 4
    };
    old.store(v.max(1), Ordering::Relaxed);
}

impl WaitClock {
    pub const fn new() -> Self {
        Self {
            waits: [const { AtomicU64::new(0) }; KEPT],
            next: AtomicUsize::new(0),
            late_ns: AtomicU64::new(0),
        }
    }

    /// The expected length of a long wait: the shortest of the last ones (0: none yet).
    pub fn expected_ns(&self) -> u64 {
        self.waits
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .filter(|&w| w > 0)
            .min()
            .unwrap_or(0)
    }

    /// How far before a wait's expected end the vCPU should be back in the guest.
    pub fn lead_ns(&self) -> u64 {
        let late = self.late_ns.load(Ordering::Relaxed);
        (late + late / 2 + LEAD_MIN_NS).min(LEAD_MAX_NS)
    }

    /// What a wait that has lasted `waited_ns` does next.
    pub fn step(&self, waited_ns: u64) -> Step {
        if waited_ns < SPIN_NS {
            return Step::Spin;
        }
        let expected = self.expected_ns();
        let window = (expected / 8 * 3).clamp(SPIN_WINDOW_NS, SPIN_WINDOW_MAX_NS);
        if expected == 0 || waited_ns >= expected.saturating_add(window) {
            return Step::Idle(IDLE_US);
        }
        let spin_from = expected.saturating_sub(self.lead_ns());
        let left_us = spin_from.saturating_sub(waited_ns) / 1000;
        if left_us == 0 {
            Step::Spin
        } else {
            Step::Idle(left_us.min(u64::from(IDLE_US)) as u32)
        }
    }

    /// A long wait (one that went past [`SPIN_NS`]) ended after `waited_ns`.
    pub fn waited(&self, waited_ns: u64) {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % KEPT;
        self.waits[i].store(waited_ns.max(1), Ordering::Relaxed);
    }

    /// An idle of `asked_us` took `took_ns` from the guest's request to its return. One
    /// that came back early was ended by an interrupt and says nothing of lateness.
    pub fn idled(&self, asked_us: u32, took_ns: u64) {
        let asked_ns = u64::from(asked_us) * 1000;
        if took_ns >= asked_ns {
            average(&self.late_ns, took_ns - asked_ns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_waits_spin_and_unknown_long_ones_idle_in_whole_slices() {
        let c = WaitClock::new();
        assert_eq!(c.step(0), Step::Spin);
        assert_eq!(c.step(SPIN_NS - 1), Step::Spin);
        assert_eq!(c.step(SPIN_NS), Step::Idle(IDLE_US));
        assert_eq!(c.step(5_000_000), Step::Idle(IDLE_US));
    }

    #[test]
    fn a_learned_wait_idles_until_the_lead_then_spins_through_its_end() {
        let c = WaitClock::new();
        for _ in 0..8 {
            c.waited(1_000_000);
            c.idled(900, 920_000);
        }
        // 20 µs late: a lead of 40 µs.
        assert_eq!(c.lead_ns(), 40_000);
        assert_eq!(c.step(60_000), Step::Idle(900));
        assert_eq!(c.step(959_000), Step::Idle(1));
        assert_eq!(c.step(960_000), Step::Spin);
        assert_eq!(c.step(1_050_000), Step::Spin);
        // A first kernel after a context switch runs about a quarter longer: still spun.
        assert_eq!(c.step(1_300_000), Step::Spin);
        // Overdue past the window (3/8 of the wait): idle again until the interrupt.
        assert_eq!(c.step(1_375_000), Step::Idle(IDLE_US));
    }

    #[test]
    fn a_wait_longer_than_one_idle_asks_for_whole_slices_first() {
        let c = WaitClock::new();
        c.waited(10_000_000);
        assert_eq!(c.step(60_000), Step::Idle(IDLE_US));
        assert_eq!(c.step(9_985_000), Step::Idle(5));
        assert_eq!(c.step(9_990_000), Step::Spin);
        // The window stops growing at its most.
        assert_eq!(c.step(10_000_000 + SPIN_WINDOW_MAX_NS - 1), Step::Spin);
        assert_eq!(c.step(10_000_000 + SPIN_WINDOW_MAX_NS), Step::Idle(IDLE_US));
        // A short wait keeps the least window.
        let c = WaitClock::new();
        c.waited(80_000);
        assert_eq!(c.step(80_000 + SPIN_WINDOW_NS - 1), Step::Spin);
        assert_eq!(c.step(80_000 + SPIN_WINDOW_NS), Step::Idle(IDLE_US));
    }

    #[test]
    fn the_expected_wait_is_the_shortest_of_the_last_few() {
        let c = WaitClock::new();
        // A shared GPU: the guest's kernel alone (1 ms), or after a neighbour's (2-3 ms).
        for w in [2_000_000, 1_000_000, 3_000_000, 2_500_000] {
            c.waited(w);
        }
        assert_eq!(c.expected_ns(), 1_000_000);
        // Longer waits only, for the ring's length: the short one is forgotten.
        for _ in 0..KEPT {
            c.waited(10_000_000);
        }
        assert_eq!(c.expected_ns(), 10_000_000);
        c.waited(200_000);
        assert_eq!(c.expected_ns(), 200_000);
    }

    #[test]
    fn lateness_follows_the_last_few_idles_and_early_ones_teach_nothing() {
        let c = WaitClock::new();
        c.idled(100, 50_000);
        assert_eq!(c.late_ns.load(Ordering::Relaxed), 0);
        assert_eq!(c.lead_ns(), LEAD_MIN_NS);
        // A very late idle is capped: spinning longer is not worth it.
        c.idled(100, 10_100_000);
        assert_eq!(c.lead_ns(), LEAD_MAX_NS);
    }
}
