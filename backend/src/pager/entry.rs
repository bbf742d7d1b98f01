//! One allocation as the pager tracks it: where each piece of it lives now.

use crate::sync::lock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

/// Where one piece of an allocation lives.
#[derive(Debug)]
pub(super) enum Piece {
    /// In the allocation's own device memory.
    Resident,
    /// Copied to a buffer in the swap area at this (hidden) device address.
    Device(u64),
    /// Copied to host memory.
    Host(Box<[u8]>),
}

/// A tracked allocation.
#[derive(Debug)]
pub(super) struct Entry {
    pub addr: u64,
    pub size: u64,
    /// Bytes charged (the span the pieces cover).
    pub charged: u64,
    /// Piece size; the last piece may be shorter.
    pub granule: u64,
    /// Mapped shared object: always resident, never charged or evicted here.
    pub shared: bool,
    /// A mapping of a physical allocation (virtual memory management; `shared` too):
    /// `MEM_UNMAP` removes it, `FREE` refuses it.
    pub mapping: bool,
    /// Operations using the allocation now; it is not evicted while this is non-zero.
    pub pins: AtomicU32,
    /// Last use, in the pager's tick order (LRU victim choice).
    pub last_use: AtomicU64,
    pub pieces: Mutex<Vec<Piece>>,
}

impl Entry {
    pub fn new(addr: u64, size: u64, charged: u64, granule: u64, shared: bool) -> Self {
        let granule = if granule == 0 || shared {
            charged.max(1)
        } else {
            granule
        };
        let n = charged.div_ceil(granule).max(1) as usize;
        Self {
            addr,
            size,
            charged,
            granule,
            shared,
            mapping: false,
            pins: AtomicU32::new(0),
            last_use: AtomicU64::new(0),
            pieces: Mutex::new((0..n).map(|_| Piece::Resident).collect()),
        }
    }

    /// Offset and length of piece `i`.
    pub fn piece(&self, i: usize) -> (u64, u64) {
        let off = i as u64 * self.granule;
        (off, self.granule.min(self.charged.saturating_sub(off)))
    }

    /// Bytes of piece `i` that hold data (the allocation's size may end before its
    /// charged span does).
    pub fn data_len(&self, i: usize) -> u64 {
        let (off, len) = self.piece(i);
        len.min(self.size.saturating_sub(off))
    }

    /// Indices of the pieces overlapping `[off, off + len)` (at least the one holding
    /// `off`).
    pub fn pieces_of(&self, off: u64, len: u64) -> std::ops::Range<usize> {
        let first = (off / self.granule) as usize;
        let last = (off.saturating_add(len.max(1)) - 1) / self.granule;
        first..(last as usize + 1)
    }

    pub fn lock(&self) -> MutexGuard<'_, Vec<Piece>> {
        // Piece updates are single assignments after the bytes moved, so a panic in
        // between leaves a consistent (if older) state.
        lock(&self.pieces)
    }

    /// The piece table if nobody holds it now.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, Vec<Piece>>> {
        match self.pieces.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    pub fn pinned(&self) -> bool {
        self.pins.load(Ordering::Acquire) > 0
    }
}

/// Keeps an entry from being evicted while an operation uses it.
pub(super) struct Pin(pub Arc<Entry>);

impl Pin {
    pub fn new(e: Arc<Entry>, tick: u64) -> Self {
        e.pins.fetch_add(1, Ordering::AcqRel);
        e.last_use.store(tick, Ordering::Relaxed);
        Self(e)
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.0.pins.fetch_sub(1, Ordering::AcqRel);
    }
}
