//! The decommitted ranges of one sim allocation (swapped out: mapped `PROT_NONE`), so that
//! an access to one is refused with an error instead of faulting the worker. Decommits and
//! recommits come from the pager (docs/memory.md) and a migration mirroring them; every
//! access checks this set first.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::sync::lock;

/// Disjoint, non-adjacent ranges `[start, end)` of an allocation, by offset.
#[derive(Debug, Default)]
pub(super) struct Holes {
    /// Some range is decommitted: an access without holes pays one atomic load.
    any: AtomicBool,
    ranges: Mutex<BTreeMap<u64, u64>>,
}

impl Holes {
    /// `[off, off + len)` is decommitted now.
    pub(super) fn add(&self, off: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (mut start, mut end) = (off, off.saturating_add(len));
        let mut r = lock(&self.ranges);
        let touching: Vec<(u64, u64)> = r
            .range(..=end)
            .rev()
            .take_while(|(_, e)| **e >= start)
            .map(|(s, e)| (*s, *e))
            .collect();
        for (s, e) in touching {
            r.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        r.insert(start, end);
        self.any.store(true, Ordering::Release);
    }

    /// `[off, off + len)` is committed again.
    pub(super) fn remove(&self, off: u64, len: u64) {
        if len == 0 || !self.any.load(Ordering::Acquire) {
            return;
        }
        let (start, end) = (off, off.saturating_add(len));
        let mut r = lock(&self.ranges);
        let cut: Vec<(u64, u64)> = r
            .range(..end)
            .rev()
            .take_while(|(_, e)| **e > start)
            .map(|(s, e)| (*s, *e))
            .collect();
        for (s, e) in cut {
            r.remove(&s);
            if s < start {
                r.insert(s, start);
            }
            if e > end {
                r.insert(end, e);
            }
        }
        self.any.store(!r.is_empty(), Ordering::Release);
    }

    /// The first decommitted range `[start, end)` that `[off, off + len)` touches.
    pub(super) fn touched(&self, off: u64, len: u64) -> Option<(u64, u64)> {
        if len == 0 || !self.any.load(Ordering::Acquire) {
            return None;
        }
        let end = off.saturating_add(len);
        let r = lock(&self.ranges);
        // The ranges are disjoint and sorted: only the last one starting before `end` can
        // reach past `off`.
        r.range(..end)
            .next_back()
            .filter(|(_, e)| **e > off)
            .map(|(s, e)| (*s, *e))
    }
}

#[cfg(test)]
mod tests {
    use super::Holes;

    #[test]
    fn ranges_merge_split_and_are_found() {
        let h = Holes::default();
        assert_eq!(h.touched(0, 1 << 30), None, "no holes");
        h.add(4096, 4096);
        h.add(12288, 4096);
        assert_eq!(h.touched(0, 4096), None, "just before");
        assert_eq!(h.touched(8192, 4096), None, "between");
        assert_eq!(h.touched(0, 4097), Some((4096, 8192)));
        assert_eq!(h.touched(8191, 2), Some((4096, 8192)));
        assert_eq!(h.touched(10000, 4000), Some((12288, 16384)));
        assert_eq!(h.touched(5000, 0), None, "an empty access touches nothing");
        // Adjacent and overlapping ranges merge into one.
        h.add(8192, 4096);
        assert_eq!(h.touched(9000, 1), Some((4096, 16384)));
        // A recommit in the middle splits it.
        h.remove(8192, 4096);
        assert_eq!(h.touched(8192, 4096), None);
        assert_eq!(h.touched(0, 8193), Some((4096, 8192)));
        assert_eq!(h.touched(12000, 1000), Some((12288, 16384)));
        // Recommitting everything leaves none.
        h.remove(0, 1 << 20);
        assert_eq!(h.touched(0, 1 << 20), None);
        assert!(!h.any.load(std::sync::atomic::Ordering::Relaxed));
    }
}
