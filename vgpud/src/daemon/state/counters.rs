//! A vGPU's counters over all its workers. A process vGPU gets a fresh worker for each
//! process (its counters and clock start at zero); what the workers before it counted is
//! kept here and added to the current one's, so that the vGPU's counters only grow while
//! vgpud runs. A worker's last report can arrive after the next worker took over: it is
//! told apart by the generation its events were tagged with, and adds only what it
//! counted since the report that was kept for it.

use crate::control::WorkerStats;

/// The counting part of a worker's report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(in crate::daemon) struct Counters {
    pub requests: u64,
    pub errors: u64,
    pub bytes_htod: u64,
    pub bytes_dtoh: u64,
    pub bytes_dtod: u64,
    pub kernels: u64,
    pub kernel_ns: u64,
}

impl Counters {
    pub(in crate::daemon) fn of(s: &WorkerStats) -> Self {
        Self {
            requests: s.requests,
            errors: s.errors,
            bytes_htod: s.bytes_htod,
            bytes_dtoh: s.bytes_dtoh,
            bytes_dtod: s.bytes_dtod,
            kernels: s.kernels,
            kernel_ns: s.kernel_ns,
        }
    }

    /// Field by field, `f(self, other)`.
    fn zip(self, o: Self, f: impl Fn(u64, u64) -> u64) -> Self {
        Self {
            requests: f(self.requests, o.requests),
            errors: f(self.errors, o.errors),
            bytes_htod: f(self.bytes_htod, o.bytes_htod),
            bytes_dtoh: f(self.bytes_dtoh, o.bytes_dtoh),
            bytes_dtod: f(self.bytes_dtod, o.bytes_dtod),
            kernels: f(self.kernels, o.kernels),
            kernel_ns: f(self.kernel_ns, o.kernel_ns),
        }
    }

    pub(in crate::daemon) fn plus(self, o: Self) -> Self {
        self.zip(o, u64::saturating_add)
    }
}

/// What the workers before the current one counted.
#[derive(Debug, Default)]
pub(in crate::daemon) struct Earlier {
    /// Their counters together.
    total: Counters,
    /// What was kept of the last one retired (a late report adds what is past it).
    retired: Counters,
    /// Bumped each time a fresh worker takes over.
    generation: u64,
}

impl Earlier {
    pub(in crate::daemon) fn total(&self) -> Counters {
        self.total
    }

    /// The current worker's generation.
    pub(in crate::daemon) fn generation(&self) -> u64 {
        self.generation
    }

    /// The current worker is replaced; `last` is what it reported last.
    pub(in crate::daemon) fn retire(&mut self, last: Counters) {
        self.total = self.total.plus(last);
        self.retired = last;
        self.generation += 1;
    }

    /// A report `s` of the worker retired last, come after it was replaced: adds what
    /// it counted since the report kept for it. False when `s` is from no such worker.
    pub(in crate::daemon) fn late(&mut self, generation: u64, s: &WorkerStats) -> bool {
        if generation.checked_add(1) != Some(self.generation) {
            return false;
        }
        let c = Counters::of(s);
        self.total = self.total.plus(c.zip(self.retired, u64::saturating_sub));
        self.retired = self.retired.zip(c, u64::max);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(kernels: u64, requests: u64) -> WorkerStats {
        WorkerStats {
            kernels,
            requests,
            ..WorkerStats::default()
        }
    }

    #[test]
    fn counters_add_up_over_workers_and_a_late_final_report_adds_only_what_is_new() {
        let mut e = Earlier::default();
        assert_eq!(e.generation(), 0);
        // The first worker's last sample: 10 kernels, 30 requests; it is replaced.
        e.retire(Counters::of(&report(10, 30)));
        assert_eq!((e.total().kernels, e.total().requests), (10, 30));
        assert_eq!(e.generation(), 1);
        // Its final report comes afterwards: 12 kernels, 33 requests in all.
        assert!(e.late(0, &report(12, 33)));
        assert_eq!((e.total().kernels, e.total().requests), (12, 33));
        // The same report again (or an older one) adds nothing.
        assert!(e.late(0, &report(12, 33)));
        assert!(e.late(0, &report(11, 31)));
        assert_eq!((e.total().kernels, e.total().requests), (12, 33));
        // A report of the current worker, or of one two workers back, is not late.
        assert!(!e.late(1, &report(5, 5)));
        e.retire(Counters::of(&report(5, 6)));
        assert!(!e.late(0, &report(99, 99)));
        assert_eq!((e.total().kernels, e.total().requests), (17, 39));
    }
}
