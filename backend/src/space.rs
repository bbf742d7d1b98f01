//! Book-keeping every backend's device address space shares: the free holes of the vGPU's
//! reserved range, and the charge against its memory share.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::sync::lock;
use crate::{BackendError, Result};

/// Free holes of an address range: offset -> length, first fit, merged on free.
#[derive(Debug)]
pub(crate) struct Holes(Mutex<BTreeMap<u64, u64>>);

impl Holes {
    /// One hole covering `len` bytes from offset 0.
    pub fn new(len: u64) -> Self {
        let mut m = BTreeMap::new();
        if len > 0 {
            m.insert(0, len);
        }
        Self(Mutex::new(m))
    }

    /// Takes the first hole of at least `len` bytes; its offset.
    pub fn take(&self, len: u64) -> Option<u64> {
        let mut holes = lock(&self.0);
        let (&off, &hole) = holes.iter().find(|(_, &l)| l >= len)?;
        holes.remove(&off);
        if hole > len {
            holes.insert(off + len, hole - len);
        }
        Some(off)
    }

    /// Takes exactly `off..off + len` if it lies inside one hole.
    pub fn take_at(&self, off: u64, len: u64) -> bool {
        let mut holes = lock(&self.0);
        let Some((&h, &hlen)) = holes.range(..=off).next_back() else {
            return false;
        };
        let (Some(end), Some(hend)) = (off.checked_add(len), h.checked_add(hlen)) else {
            return false;
        };
        if end > hend {
            return false;
        }
        holes.remove(&h);
        if off > h {
            holes.insert(h, off - h);
        }
        if hend > end {
            holes.insert(end, hend - end);
        }
        true
    }

    /// Returns `off..off+len`, merging it with its neighbours.
    pub fn give(&self, off: u64, len: u64) {
        let mut holes = lock(&self.0);
        let (mut start, mut end) = (off, off + len);
        if let Some((&p, &plen)) = holes.range(..off).next_back() {
            if p + plen == off {
                holes.remove(&p);
                start = p;
            }
        }
        if let Some(&nlen) = holes.get(&end) {
            holes.remove(&end);
            end += nlen;
        }
        holes.insert(start, end - start);
    }
}

/// Adds `bytes` to `used` if the total stays within `capacity`.
pub(crate) fn charge(used: &AtomicU64, capacity: u64, bytes: u64) -> Result<()> {
    used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
        u.checked_add(bytes).filter(|t| *t <= capacity)
    })
    .map(|_| ())
    .map_err(|u| BackendError::OutOfMemory {
        requested: bytes,
        available: capacity.saturating_sub(u),
        capacity,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holes_split_and_merge() {
        let h = Holes::new(100);
        assert_eq!(h.take(30), Some(0));
        assert_eq!(h.take(30), Some(30));
        assert_eq!(h.take(50), None);
        h.give(0, 30);
        h.give(30, 30);
        assert_eq!(h.take(100), Some(0), "freed holes merge back into one");
        h.give(0, 100);
        assert!(h.take_at(40, 20));
        assert!(!h.take_at(50, 20), "overlaps a taken range");
        assert!(!h.take_at(90, 20), "runs past the end");
        assert_eq!(h.take(40), Some(0));
        assert_eq!(h.take(40), Some(60));
    }

    #[test]
    fn charges_stay_within_capacity() {
        let used = AtomicU64::new(0);
        charge(&used, 100, 60).unwrap();
        assert!(matches!(
            charge(&used, 100, 50),
            Err(BackendError::OutOfMemory { available: 40, .. })
        ));
        charge(&used, 100, 40).unwrap();
    }
}
