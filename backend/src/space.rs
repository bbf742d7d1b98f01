//! Book-keeping every backend's device address space shares: the free holes of the vGPU's
//! reserved range, the charge against its memory share and the count of live allocations
//! (the [`Ledger`]), the table of live allocations by address ([`AllocTable`]), and the
//! argument checks every backend makes the same way.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use crate::sync::{lock, read, write};
use crate::{BackendError, MemoryUsage, Result};

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

    /// Takes the first `len` bytes whose address `base + offset` is a multiple of
    /// `align`; the offset.
    pub fn take_aligned(&self, base: u64, len: u64, align: u64) -> Option<u64> {
        let found = {
            let holes = lock(&self.0);
            holes.iter().find_map(|(&off, &hlen)| {
                let addr = base.checked_add(off)?;
                let start = addr.checked_add(align - 1)? / align * align - base;
                let end = start.checked_add(len)?;
                (end <= off.checked_add(hlen)?).then_some(start)
            })
        };
        found.filter(|start| self.take_at(*start, len))
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

/// Device memory a vGPU causes outside its allocations and modules, charged to its ledger
/// as an entry of its own (docs/memory.md, "What is charged").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reserve {
    /// The GPU context's per-thread stacks, device `malloc` heap and printf FIFO (cuda; 0 on
    /// sim), charged when the backend starts.
    Context,
    /// What the storage kernels set up for an attached namespace: its cache lines, queue
    /// pair and doorbells (and on cuda the device block of the queue's and cache's state),
    /// charged on the namespace's first use by a storage kernel.
    Storage,
}

impl Reserve {
    const ALL: [Reserve; 2] = [Reserve::Context, Reserve::Storage];

    fn index(self) -> usize {
        match self {
            Reserve::Context => 0,
            Reserve::Storage => 1,
        }
    }

    /// The entry's name in logs and messages.
    pub fn name(self) -> &'static str {
        match self {
            Reserve::Context => "context",
            Reserve::Storage => "storage",
        }
    }
}

/// A vGPU address space's accounts: free holes of its reserved range (offsets from the
/// range's start), bytes charged against its capacity (allocations, modules and the
/// [`Reserve`] entries, which are also kept apart), and live allocations (counting freed
/// ones that running work still holds).
#[derive(Debug)]
pub(crate) struct Ledger {
    holes: Holes,
    capacity: u64,
    used: AtomicU64,
    count: AtomicU64,
    reserved: [AtomicU64; Reserve::ALL.len()],
}

impl Ledger {
    /// A range of `va_len` bytes, all free, and `capacity` bytes to charge.
    pub fn new(va_len: u64, capacity: u64) -> Self {
        Self {
            holes: Holes::new(va_len),
            capacity,
            used: AtomicU64::new(0),
            count: AtomicU64::new(0),
            reserved: Default::default(),
        }
    }

    /// Charges `bytes` to entry `what` if they fit the capacity (allocations see them).
    pub fn charge_reserve(&self, what: Reserve, bytes: u64) -> Result<()> {
        self.charge(bytes)?;
        self.reserved[what.index()].fetch_add(bytes, Ordering::AcqRel);
        tracing::debug!(entry = what.name(), bytes, used = self.used(), "charged");
        Ok(())
    }

    /// Returns `bytes` of entry `what` (at most what it holds).
    pub fn uncharge_reserve(&self, what: Reserve, bytes: u64) {
        let slot = &self.reserved[what.index()];
        let held = slot
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                Some(h.saturating_sub(bytes))
            })
            .unwrap_or(0);
        self.uncharge(bytes.min(held));
    }

    /// Bytes entry `what` holds now.
    #[cfg(test)]
    pub fn reserved(&self, what: Reserve) -> u64 {
        self.reserved[what.index()].load(Ordering::Acquire)
    }

    /// Takes the first free range of `len` bytes; its offset.
    pub fn take_hole(&self, len: u64) -> Option<u64> {
        self.holes.take(len)
    }

    /// Takes exactly `off..off + len` if it is free.
    pub fn take_hole_at(&self, off: u64, len: u64) -> bool {
        self.holes.take_at(off, len)
    }

    /// Takes the first free `len` bytes whose address `base + offset` is a multiple of
    /// `align` (a power of two); the offset.
    pub fn take_hole_aligned(&self, base: u64, len: u64, align: u64) -> Option<u64> {
        self.holes.take_aligned(base, len, align)
    }

    /// Frees `off..off + len`.
    pub fn give_hole(&self, off: u64, len: u64) {
        self.holes.give(off, len)
    }

    /// Charges `bytes` if they fit the capacity.
    pub fn charge(&self, bytes: u64) -> Result<()> {
        charge(&self.used, self.capacity, bytes)
    }

    /// Returns a charge.
    pub fn uncharge(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Counts a new allocation.
    pub fn added(&self) {
        self.count.fetch_add(1, Ordering::AcqRel);
    }

    /// An allocation charged `charged` bytes is gone: frees its range `hole` (offset,
    /// length; `None`: the range stays retired, still mapped), returns its charge and
    /// uncounts it.
    pub fn released(&self, hole: Option<(u64, u64)>, charged: u64) {
        if let Some((off, len)) = hole {
            self.give_hole(off, len);
        }
        self.uncharge(charged);
        self.count.fetch_sub(1, Ordering::AcqRel);
    }

    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// What [`Backend::memory_usage`](crate::Backend::memory_usage) reports.
    pub fn usage(&self) -> MemoryUsage {
        MemoryUsage {
            used: self.used(),
            capacity: self.capacity,
            allocations: self.count.load(Ordering::Acquire),
        }
    }

    /// The error for an allocation of `requested` bytes that cannot be charged.
    pub fn out_of_memory(&self, requested: u64) -> BackendError {
        BackendError::OutOfMemory {
            requested,
            available: self.capacity.saturating_sub(self.used()),
            capacity: self.capacity,
        }
    }
}

/// What the allocation table needs to know of an allocation (its first device address is
/// its key).
pub(crate) trait Extent {
    /// Its size in bytes as requested (device ranges must lie inside it).
    fn size(&self) -> u64;

    /// True for a read-only mapping (a shared object attached with the read-only flag):
    /// copies, memsets and kernels must not write it.
    fn read_only(&self) -> bool {
        false
    }
}

/// Live allocations by first device address. Removing one only drops the table's
/// reference: work still using it (it holds an `Arc`) keeps its memory until it ends.
#[derive(Debug)]
pub(crate) struct AllocTable<A>(RwLock<BTreeMap<u64, Arc<A>>>);

impl<A> Default for AllocTable<A> {
    fn default() -> Self {
        Self(RwLock::new(BTreeMap::new()))
    }
}

impl<A: Extent> AllocTable<A> {
    /// Lists `a` under its first address `addr`.
    pub fn insert(&self, addr: u64, a: Arc<A>) {
        write(&self.0).insert(addr, a);
    }

    /// Takes the allocation that starts at `addr` out of the table (dropped by the caller,
    /// outside the table's lock).
    pub fn remove(&self, addr: u64) -> Result<Arc<A>> {
        let removed = write(&self.0).remove(&addr);
        removed.ok_or(BackendError::NotAllocated { addr })
    }

    /// The allocation that starts exactly at `addr`.
    pub fn exact(&self, addr: u64) -> Result<Arc<A>> {
        let found = read(&self.0).get(&addr).cloned();
        found.ok_or(BackendError::NotAllocated { addr })
    }

    /// The allocation holding `[addr, addr + len)` whole, and the offset of `addr` in it.
    pub fn resolve(&self, addr: u64, len: u64) -> Result<(Arc<A>, u64)> {
        let bad = BackendError::BadPointer { addr, len };
        let table = read(&self.0);
        let (start, a) = table.range(..=addr).next_back().ok_or(bad)?;
        let off = addr - start;
        let end = off
            .checked_add(len)
            .ok_or(BackendError::BadPointer { addr, len })?;
        if off >= a.size() || end > a.size() {
            return Err(BackendError::BadPointer { addr, len });
        }
        Ok((a.clone(), off))
    }

    /// Like [`resolve`](Self::resolve), for a range about to be written (HtoD, a DtoD
    /// destination, memset): a read-only mapping is refused before any byte moves.
    pub fn resolve_write(&self, addr: u64, len: u64) -> Result<(Arc<A>, u64)> {
        let (a, off) = self.resolve(addr, len)?;
        if a.read_only() {
            return Err(BackendError::ReadOnly { addr, len });
        }
        Ok((a, off))
    }

    /// Refuses a kernel pointer argument the kernel may write through (`WRITE` or
    /// `READ_WRITE`) when it points into a read-only mapping. A pointer inside no
    /// allocation passes here: the kernel's own range check answers it.
    pub fn check_kernel_write(&self, addr: u64) -> Result<()> {
        match self.resolve(addr, 0) {
            Ok((a, _)) if a.read_only() => Err(BackendError::ReadOnly { addr, len: 0 }),
            _ => Ok(()),
        }
    }

    /// [`check_kernel_write`](Self::check_kernel_write) for every pointer argument of a
    /// launch that the kernel may write through.
    pub fn check_kernel_writes(&self, args: &[vgpu_proto::ArgValue]) -> Result<()> {
        for arg in args {
            if let vgpu_proto::ArgValue::Ptr { addr, access } = *arg {
                if access.writes() {
                    self.check_kernel_write(addr)?;
                }
            }
        }
        Ok(())
    }

    /// The table, read-locked (walks over every allocation).
    pub fn read(&self) -> RwLockReadGuard<'_, BTreeMap<u64, Arc<A>>> {
        read(&self.0)
    }

    /// Empties the table (the backend is going away), dropping outside the lock.
    pub fn clear(&self) {
        let all = std::mem::take(&mut *write(&self.0));
        drop(all);
    }
}

/// Checks a device address space `[va_base, va_base + va_size)`: not null, aligned to
/// [`vgpu_proto::DEVICE_ALLOC_ALIGN`] at both ends, not wrapping around.
pub(crate) fn check_layout(va_base: u64, va_size: u64) -> Result<()> {
    const ALIGN: u64 = vgpu_proto::DEVICE_ALLOC_ALIGN;
    if va_base % ALIGN != 0 || va_base == 0 || va_size < ALIGN || va_size % ALIGN != 0 {
        return Err(BackendError::InvalidArgument(format!(
            "device address space {va_base:#x}+{va_size:#x} must be non-null and 2 MiB aligned"
        )));
    }
    va_base.checked_add(va_size).ok_or_else(|| {
        BackendError::InvalidArgument(format!(
            "device address space {va_base:#x}+{va_size:#x} overflows"
        ))
    })?;
    Ok(())
}

/// Checks a memset's arguments: `elem_size` 1, 2 or 4, `dst` aligned to it, the byte length
/// representable. Returns the length in bytes.
pub(crate) fn memset_len(dst: u64, elem_size: u32, count: u64) -> Result<u64> {
    let esize = u64::from(elem_size);
    if !matches!(elem_size, 1 | 2 | 4) {
        return Err(BackendError::InvalidArgument(format!(
            "memset element size {elem_size}; use 1, 2 or 4"
        )));
    }
    let len = count.checked_mul(esize).ok_or(BackendError::BadPointer {
        addr: dst,
        len: u64::MAX,
    })?;
    if dst % esize != 0 {
        return Err(BackendError::Misaligned {
            addr: dst,
            align: esize,
        });
    }
    Ok(len)
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
    fn aligned_takes_skip_to_the_next_aligned_address() {
        let h = Holes::new(100);
        assert!(h.take_at(0, 10));
        // Base 4: address 4 + 10 = 14 is not a multiple of 16; 16 is (offset 12).
        assert_eq!(h.take_aligned(4, 20, 16), Some(12));
        assert_eq!(
            h.take_aligned(4, 50, 16),
            Some(44),
            "the next aligned hole that fits"
        );
        assert_eq!(
            h.take_aligned(4, 60, 16),
            None,
            "nothing aligned is left that fits"
        );
        assert_eq!(h.take(2), Some(10), "the skipped bytes stay free");
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

    #[test]
    fn reserve_entries_count_in_used_and_come_back() {
        let l = Ledger::new(1 << 30, 100);
        l.charge_reserve(Reserve::Context, 30).unwrap();
        l.charge_reserve(Reserve::Storage, 20).unwrap();
        l.charge(40).unwrap();
        assert_eq!(l.used(), 90, "entries count in used");
        assert_eq!(l.reserved(Reserve::Context), 30);
        assert_eq!(l.reserved(Reserve::Storage), 20);
        assert!(
            matches!(
                l.charge_reserve(Reserve::Storage, 11),
                Err(BackendError::OutOfMemory { available: 10, .. })
            ),
            "an entry that does not fit is refused"
        );
        assert_eq!(
            l.reserved(Reserve::Storage),
            20,
            "a refused charge holds nothing"
        );
        l.uncharge_reserve(Reserve::Storage, 20);
        assert_eq!((l.used(), l.reserved(Reserve::Storage)), (70, 0));
        l.uncharge_reserve(Reserve::Storage, 5);
        assert_eq!(l.used(), 70, "an entry never returns more than it holds");
        assert_eq!(l.usage().used, 70);
    }
}
