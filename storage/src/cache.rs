//! A software cache over the namespace, after BaM's page cache (§4): fixed-size lines in
//! DMA memory, a per-line state word (valid/busy, slot, reference count), clock
//! replacement with a reference bit per slot, and miss coalescing: the first thread to
//! miss a line claims it (busy) and issues the one I/O, later ones wait for it. Lines are
//! read-only; writes go through [`Namespace::write`] followed by [`PageCache::invalidate`].

use crate::error::{Error, Result};
use crate::memory::{DmaRegion, DmaSlice};
use crate::namespace::Namespace;
use crate::queue::Backoff;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

const VALID: u64 = 1 << 63;
const BUSY: u64 = 1 << 62;
const SLOT_SHIFT: u32 = 32;
const SLOT_MASK: u64 = (1 << 30) - 1;
const REF_MASK: u64 = 0xffff_ffff;

fn slot_of(state: u64) -> usize {
    ((state >> SLOT_SHIFT) & SLOT_MASK) as usize
}

/// Counters since the cache was made.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Bytes read from the namespace to fill lines.
    pub bytes_read: u64,
    pub evictions: u64,
}

pub struct PageCache {
    ns: Arc<Namespace>,
    line: usize,
    nlines: usize,
    mem: Arc<DmaRegion>,
    /// One state word per line-sized piece of the namespace.
    pages: Box<[AtomicU64]>,
    /// Per slot: page + 1 that owns it, 0 when free.
    owner: Box<[AtomicU64]>,
    referenced: Box<[AtomicBool]>,
    slot_lock: Box<[AtomicBool]>,
    hand: AtomicUsize,
    hits: AtomicU64,
    misses: AtomicU64,
    bytes_read: AtomicU64,
    evictions: AtomicU64,
}

/// A pinned cache line: it cannot be evicted until this is dropped.
pub struct LineRef<'a> {
    cache: &'a PageCache,
    page: u64,
    slot: usize,
}

impl LineRef<'_> {
    /// Pointer to the first byte of the line.
    pub fn as_ptr(&self) -> *const u8 {
        // SAFETY: slot < nlines, so the line lies inside the cache memory.
        unsafe { self.cache.mem.as_ptr().add(self.slot * self.cache.line) }
    }
    pub fn page(&self) -> u64 {
        self.page
    }
}

impl Drop for LineRef<'_> {
    fn drop(&mut self) {
        self.cache.pages[self.page as usize].fetch_sub(1, Ordering::Release);
    }
}

impl PageCache {
    /// A cache of `nlines` lines of `line_size` bytes (a multiple of the block size and at
    /// most the controller's maximum transfer, so one line is one command).
    pub fn new(ns: Arc<Namespace>, line_size: usize, nlines: usize) -> Result<Arc<Self>> {
        let bs = ns.block_size() as usize;
        if line_size == 0 || line_size % bs != 0 || line_size as u64 > ns.max_transfer() {
            return Err(Error::InvalidArgument(format!(
                "cache line {line_size} must be a multiple of the {bs}-byte block and at most {} bytes",
                ns.max_transfer()
            )));
        }
        if nlines == 0 || nlines as u64 > SLOT_MASK {
            return Err(Error::InvalidArgument(format!("cache of {nlines} lines")));
        }
        let npages = ns.bytes().div_ceil(line_size as u64) as usize;
        let mem = ns.alloc_dma(line_size * nlines)?;
        let mk = |n: usize| (0..n).map(|_| AtomicU64::new(0)).collect::<Box<[_]>>();
        let mkb = |n: usize| (0..n).map(|_| AtomicBool::new(false)).collect::<Box<[_]>>();
        Ok(Arc::new(PageCache {
            line: line_size,
            nlines,
            mem,
            pages: mk(npages),
            owner: mk(nlines),
            referenced: mkb(nlines),
            slot_lock: mkb(nlines),
            hand: AtomicUsize::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            ns,
        }))
    }

    pub fn line_size(&self) -> usize {
        self.line
    }
    pub fn lines(&self) -> usize {
        self.nlines
    }
    /// Bytes of DMA memory the cache lines take (what a vGPU is charged for them).
    pub fn memory_bytes(&self) -> usize {
        self.mem.len()
    }
    pub fn namespace(&self) -> &Arc<Namespace> {
        &self.ns
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }

    /// Pin the line holding namespace page `page`, reading it from storage on a miss.
    pub fn acquire(&self, page: u64) -> Result<LineRef<'_>> {
        let Some(state) = self.pages.get(page as usize) else {
            return Err(Error::OutOfRange {
                offset: page * self.line as u64,
                len: self.line as u64,
                size: self.ns.bytes(),
            });
        };
        // The filler itself times out after the queue timeout; allow it that and more.
        let deadline = Instant::now() + self.ns.queues()[0].timeout() * 2;
        let mut backoff = Backoff::default();
        loop {
            let s = state.load(Ordering::Acquire);
            if s & VALID != 0 {
                if s & REF_MASK == REF_MASK {
                    return Err(Error::InvalidArgument(
                        "cache line reference count overflow".into(),
                    ));
                }
                if state
                    .compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    let slot = slot_of(s);
                    if !self.referenced[slot].load(Ordering::Relaxed) {
                        self.referenced[slot].store(true, Ordering::Relaxed);
                    }
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(LineRef {
                        cache: self,
                        page,
                        slot,
                    });
                }
            } else if s & BUSY != 0 {
                // Someone else's miss on this line is in flight: wait for its one I/O.
                if Instant::now() > deadline {
                    return Err(Error::Timeout(self.ns.queues()[0].timeout() * 2));
                }
                backoff.snooze();
            } else if state
                .compare_exchange(0, BUSY, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return self.fill(page);
            }
        }
    }

    fn fill(&self, page: u64) -> Result<LineRef<'_>> {
        self.misses.fetch_add(1, Ordering::Relaxed);
        let state = &self.pages[page as usize];
        let slot = match self.evict_for(page) {
            Ok(s) => s,
            Err(e) => {
                state.store(0, Ordering::Release);
                return Err(e);
            }
        };
        let off = page * self.line as u64;
        let len = (self.line as u64).min(self.ns.bytes() - off) as usize;
        let res = DmaSlice::new(self.mem.clone(), slot * self.line, len)
            .and_then(|buf| self.ns.read(off, &buf));
        if let Err(e) = res {
            self.owner[slot].store(0, Ordering::Release);
            state.store(0, Ordering::Release);
            return Err(e);
        }
        self.bytes_read.fetch_add(len as u64, Ordering::Relaxed);
        self.referenced[slot].store(true, Ordering::Relaxed);
        state.store(VALID | ((slot as u64) << SLOT_SHIFT) | 1, Ordering::Release);
        Ok(LineRef {
            cache: self,
            page,
            slot,
        })
    }

    /// Clock: sweep slots from the hand; a set reference bit buys one more sweep; a line
    /// with readers is skipped. Claims the slot for `page`.
    fn evict_for(&self, page: u64) -> Result<usize> {
        let deadline = Instant::now() + self.ns.queues()[0].timeout();
        loop {
            for _ in 0..self.nlines * 3 {
                let i = self.hand.fetch_add(1, Ordering::Relaxed) % self.nlines;
                if self.slot_lock[i].swap(true, Ordering::Acquire) {
                    continue;
                }
                let got = self.try_take(i, page);
                self.slot_lock[i].store(false, Ordering::Release);
                if got {
                    return Ok(i);
                }
            }
            if Instant::now() > deadline {
                return Err(Error::CacheExhausted(self.nlines));
            }
            std::thread::yield_now();
        }
    }

    /// With slot `i` locked: take it if free or evictable.
    fn try_take(&self, i: usize, page: u64) -> bool {
        let owner = self.owner[i].load(Ordering::Acquire);
        if owner != 0 {
            if self.referenced[i].swap(false, Ordering::Relaxed) {
                return false;
            }
            let victim = &self.pages[(owner - 1) as usize];
            let s = victim.load(Ordering::Acquire);
            // Only an idle valid line in this slot can go; BUSY means its fill is still
            // claiming this very slot (cannot happen while we hold the lock, but be safe).
            if s & VALID == 0 || s & REF_MASK != 0 || slot_of(s) != i {
                return false;
            }
            if victim
                .compare_exchange(s, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return false;
            }
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        self.owner[i].store(page + 1, Ordering::Release);
        true
    }

    /// Drop every idle line (after the namespace was written behind the cache's back).
    /// Lines pinned by readers stay; returns how many did.
    pub fn invalidate(&self) -> usize {
        let mut pinned = 0;
        for i in 0..self.nlines {
            while self.slot_lock[i].swap(true, Ordering::Acquire) {
                std::hint::spin_loop();
            }
            let owner = self.owner[i].load(Ordering::Acquire);
            if owner != 0 {
                let st = &self.pages[(owner - 1) as usize];
                let s = st.load(Ordering::Acquire);
                if s & VALID != 0
                    && s & REF_MASK == 0
                    && st
                        .compare_exchange(s, 0, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                {
                    self.owner[i].store(0, Ordering::Release);
                } else {
                    pinned += 1;
                }
            }
            self.slot_lock[i].store(false, Ordering::Release);
        }
        pinned
    }
}
