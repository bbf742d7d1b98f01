//! What a move of an oversubscribed vGPU to another host needs from its pager: the
//! source reads every allocation's bytes where they are (swapped pieces included, nothing
//! restored) and holds swapping still through its stop; the destination adopts the
//! allocations it places so that they are the pager's own (charged, tracked, evictable).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use vm_memory::VolatileSlice;

use super::entry::{Entry, Piece, Pin};
use super::Pager;
use crate::sync::{lock, read, write};
use crate::{Backend, BackendError, Result};

/// `e`'s piece table, waiting at most `patience` for it.
fn lock_within(e: &Entry, patience: Duration) -> Result<MutexGuard<'_, Vec<Piece>>> {
    let start = Instant::now();
    loop {
        if let Some(g) = e.try_lock() {
            return Ok(g);
        }
        if start.elapsed() >= patience {
            return Err(BackendError::Device(format!(
                "the pieces of allocation {:#x} stayed busy for {patience:?}",
                e.addr
            )));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

impl Pager {
    /// Copies `dst.len()` bytes of `e` from offset `off` into `dst`, each piece read where
    /// it is now through `via` (device memory and the swap area) or from host memory:
    /// swapped bytes are not restored for a read. With `patience`, a piece table busy for
    /// longer is an error instead of a wait.
    pub(super) fn read_pieces(
        &self,
        via: &dyn Backend,
        e: &Entry,
        off: u64,
        dst: &VolatileSlice<'_>,
        patience: Option<Duration>,
    ) -> Result<u64> {
        let len = dst.len() as u64;
        if e.shared {
            return via.copy_dtoh(e.addr + off, dst);
        }
        let pieces = match patience {
            None => e.lock(),
            Some(p) => lock_within(e, p)?,
        };
        let range = e.pieces_of(off, len);
        if range.clone().all(|i| matches!(pieces[i], Piece::Resident)) {
            drop(pieces);
            return via.copy_dtoh(e.addr + off, dst);
        }
        for i in range {
            let (poff, _) = e.piece(i);
            let from = off.max(poff);
            let to = (off + len).min(poff + e.data_len(i));
            if from >= to {
                continue;
            }
            let n = (to - from) as usize;
            let out = dst
                .subslice((from - off) as usize, n)
                .map_err(|err| BackendError::Device(format!("guest slice: {err}")))?;
            match &pieces[i] {
                Piece::Resident => {
                    via.copy_dtoh(e.addr + from, &out)?;
                }
                Piece::Device(buf) => {
                    via.copy_dtoh(buf + (from - poff), &out)?;
                }
                Piece::Host(bytes) => {
                    let at = (from - poff) as usize;
                    let part = bytes.get(at..at + n).ok_or(BackendError::BadPointer {
                        addr: e.addr + from,
                        len: n as u64,
                    })?;
                    out.copy_from(part);
                }
            }
        }
        Ok(len)
    }

    /// Reads `dst.len()` bytes of the allocation at `addr` from `src` on, swapped pieces
    /// where they are, device memory through `gpu` (a backend below the pager that sees
    /// the same addresses: the GPU itself, so that a move's stop, which holds every layer
    /// between, can read). With `patience` (a move's stop: an operation holding a piece
    /// table may wait for the layers the stop holds), a piece table busy for longer is an
    /// error instead of a wait.
    /// The read keeps the allocation's place in the eviction order.
    pub fn read_for_move(
        &self,
        gpu: &dyn Backend,
        src: u64,
        dst: &VolatileSlice<'_>,
        patience: Option<Duration>,
    ) -> Result<u64> {
        let len = dst.len() as u64;
        let bad = BackendError::BadPointer { addr: src, len };
        let e = {
            let entries = read(&self.entries);
            let (_, e) = entries.range(..=src).next_back().ok_or(bad)?;
            e.clone()
        };
        let off = src - e.addr;
        if off.checked_add(len).is_none_or(|end| end > e.size) {
            return Err(BackendError::BadPointer { addr: src, len });
        }
        // Pinned so that no eviction takes a piece between the look and the read.
        let pin = Pin::new(e.clone(), e.last_use.load(Ordering::Relaxed));
        self.read_pieces(gpu, &pin.0, off, dst, patience)
    }

    /// True if `addr` is an allocation of the guest's that this pager tracks (its swap-area
    /// buffers and shared mappings are not).
    pub fn owns(&self, addr: u64) -> bool {
        read(&self.entries).get(&addr).is_some_and(|e| !e.shared)
    }

    /// Keeps every piece where it is (no eviction or spill runs) until the guard drops.
    /// Take it before any lock of the layers below.
    pub fn hold_swapping(&self) -> MutexGuard<'_, ()> {
        lock(&self.swapping)
    }

    /// Makes an allocation of `size` bytes already placed at `addr` below the pager (it
    /// charged `charged`) the pager's own, resident: it counts against the share and the
    /// broker's reservation. Nothing is written below. It is not evicted until
    /// [`Pager::settle`] (the move's state is whole: until then the layers below may hold
    /// every operation back, an eviction's too).
    pub fn adopt(&self, addr: u64, size: u64, charged: u64) -> Result<()> {
        if size == 0 || charged < size {
            return Err(BackendError::InvalidArgument(format!(
                "adopting {size} bytes charged as {charged}"
            )));
        }
        if read(&self.entries).contains_key(&addr) {
            return Err(BackendError::InvalidArgument(format!(
                "{addr:#x} is tracked already"
            )));
        }
        let used = self
            .state()
            .used
            .saturating_add(self.module_bytes.load(Ordering::Acquire));
        if used.saturating_add(charged) > self.share {
            return Err(BackendError::OutOfMemory {
                requested: charged,
                available: self.share.saturating_sub(used),
                capacity: self.share,
            });
        }
        if let Err(why) = self.broker.reserve(charged) {
            self.report();
            return Err(BackendError::MemoryPressure {
                requested: charged,
                why,
            });
        }
        let mut e = Entry::new(addr, size, charged, self.granule, false);
        e.last_use = AtomicU64::new(self.next_tick());
        e.pins = AtomicU32::new(1);
        lock(&self.adopted).insert(addr);
        self.counters.used.fetch_add(charged, Ordering::Relaxed);
        self.counters.resident.fetch_add(charged, Ordering::Relaxed);
        self.insert(e);
        self.report();
        Ok(())
    }

    /// Every adopted allocation not settled yet may be evicted from now on.
    pub fn settle(&self) {
        let addrs = std::mem::take(&mut *lock(&self.adopted));
        let entries = read(&self.entries);
        for addr in addrs {
            if let Some(e) = entries.get(&addr) {
                e.pins.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// A module variable that arrived with a moved vGPU: `[addr, addr + size)` of module
    /// `module` is the module's memory (copies and kernels reach it as after a lookup).
    pub fn adopt_global(&self, addr: u64, size: u64, module: u64) {
        if size > 0 {
            lock(&self.globals).insert(addr, (size, module));
        }
    }

    /// Stops tracking an allocation at `addr` adopted and not settled, without freeing it
    /// below (its placer frees it). Anything else stays as it is.
    pub fn disown(&self, addr: u64) {
        if !lock(&self.adopted).remove(&addr) {
            return;
        }
        let Some(e) = write(&self.entries).remove(&addr) else {
            return;
        };
        // Never evicted (pinned since its adoption): every piece is resident.
        self.counters.used.fetch_sub(e.charged, Ordering::Relaxed);
        self.counters
            .resident
            .fetch_sub(e.charged, Ordering::Relaxed);
        self.report();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_piece_table_is_an_error_after_the_patience_and_free_one_is_had() {
        let e = Entry::new(0x1000, 4096, 4096, 4096, false);
        let held = e.lock();
        let t = Instant::now();
        let err = lock_within(&e, Duration::from_millis(20)).expect_err("busy");
        assert!(t.elapsed() >= Duration::from_millis(20));
        assert!(err.to_string().contains("busy"), "{err}");
        drop(held);
        assert!(lock_within(&e, Duration::from_millis(20)).is_ok());
    }
}
