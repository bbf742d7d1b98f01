//! Device memory oversubscription inside one worker: the [`Pager`] wraps a vGPU's backend,
//! tracks where each piece of each allocation lives (device memory, the GPU's swap area,
//! host memory), evicts pieces when its [`Broker`] asks, and restores them on demand
//! (Gdev §4), so device addresses never change and the guest never notices.
//!
//! Restores are driven by the API: a copy into a range restores only the pieces it
//! touches (pieces it overwrites whole are not even read back); a copy out of a swapped
//! range reads the swapped bytes where they are, restoring nothing; a launch restores the
//! allocations its pointer arguments point into, or all of them when an argument may be a
//! raw device address. Eviction takes only allocations no operation is using.
//!
//! Decisions (how much to evict, from whom, to which tier) belong to the broker: vgpud for
//! a worker, across processes. The pager only moves bytes, through the wrapped backend's
//! [`Paging`](crate::Paging) capability (without it, eviction frees nothing). Above it, it
//! offers every capability of what it wraps, through its own bookkeeping where that
//! matters (capabilities.rs): decommitting swaps the range out, placing an allocation
//! adopts it.

mod broker;
mod capabilities;
mod entry;
mod moving;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use vgpu_proto::ArgValue;
use vm_memory::VolatileSlice;

use crate::sync::{read, write};
use crate::{
    one_result, require_paging, Allocated, Backend, BackendError, Launch, LaunchStats, MemoryUsage,
    Modules, Paging, Relocatable, Result, SharedMemory,
};
pub use broker::{Broker, LocalBroker, LocalMember};
use entry::{Entry, Piece, Pin};
pub use vgpu_scheduler::memory::{MemState, Member, Planner, Step, Tier, Tried};

/// Size of a swap piece where the backend can swap parts of an allocation (2 MiB: the
/// device allocation alignment, so a piece never straddles two allocations).
pub const GRANULE: u64 = vgpu_proto::DEVICE_ALLOC_ALIGN;

#[derive(Debug, Default)]
struct Counters {
    used: AtomicU64,
    resident: AtomicU64,
    device_swap: AtomicU64,
    host_swap: AtomicU64,
    swap_out_bytes: AtomicU64,
    swap_in_bytes: AtomicU64,
    swap_out_ns: AtomicU64,
    swap_in_ns: AtomicU64,
    evictions: AtomicU64,
    restores: AtomicU64,
}

/// A vGPU's backend with swapping.
pub struct Pager {
    inner: Arc<dyn Backend>,
    broker: Arc<dyn Broker>,
    share: u64,
    granule: u64,
    entries: RwLock<BTreeMap<u64, Arc<Entry>>>,
    tick: AtomicU64,
    counters: Counters,
    /// Loaded modules and the bytes each holds (their footprint), which count against the
    /// share beside the allocations: module memory is never swapped.
    modules: std::sync::Mutex<BTreeMap<u64, u64>>,
    /// Module variables the guest looked up, by address: (size, module). Module memory
    /// is never swapped: copies to them go straight to the inner backend.
    globals: std::sync::Mutex<BTreeMap<u64, (u64, u64)>>,
    /// Host memory the GPU reaches at its host address (`HostMemory::map_for_device`):
    /// never swapped, copies and memsets go straight to the inner backend.
    host_mapped: std::sync::Mutex<Vec<crate::HostRegion>>,
    /// Bytes charged beside the allocations and never swapped: the modules' footprints, and
    /// what the wrapped backend charged before the pager took over (its context reserve).
    module_bytes: AtomicU64,
    /// Held by every eviction and spill; a move to another host holds it through its stop
    /// so that no piece changes place while it reads them.
    swapping: std::sync::Mutex<()>,
    /// Allocations adopted from an incoming move and not settled yet: pinned (never
    /// evicted) until the move's state is whole.
    adopted: std::sync::Mutex<std::collections::BTreeSet<u64>>,
}

impl std::fmt::Debug for Pager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pager")
            .field("share", &self.share)
            .field("state", &self.state())
            .finish()
    }
}

fn ns_since(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Pager {
    /// Wraps `inner`. The vGPU may allocate `share` bytes in all; how many of them are
    /// resident at a time is up to `broker`. `inner` must be able to hold `share` bytes
    /// plus its swap-area buffers.
    pub fn new(inner: Arc<dyn Backend>, broker: Arc<dyn Broker>, share: u64) -> Self {
        let granule = inner.paging().map_or(0, |p| p.commit_granule());
        let fixed = inner.memory_usage().used;
        Self {
            inner,
            broker,
            share,
            granule,
            entries: RwLock::new(BTreeMap::new()),
            tick: AtomicU64::new(0),
            counters: Counters::default(),
            modules: std::sync::Mutex::new(BTreeMap::new()),
            globals: std::sync::Mutex::new(BTreeMap::new()),
            host_mapped: std::sync::Mutex::new(Vec::new()),
            module_bytes: AtomicU64::new(fixed),
            swapping: std::sync::Mutex::new(()),
            adopted: std::sync::Mutex::new(std::collections::BTreeSet::new()),
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &Arc<dyn Backend> {
        &self.inner
    }

    /// Where the vGPU's memory is now.
    pub fn state(&self) -> MemState {
        // Counters, not a walk over the pieces: the state is reported while a piece table
        // is locked (a restore waiting for its reservation).
        let c = &self.counters;
        let mut s = MemState {
            used: c.used.load(Ordering::Relaxed),
            resident: c.resident.load(Ordering::Relaxed),
            device_swap: c.device_swap.load(Ordering::Relaxed),
            host_swap: c.host_swap.load(Ordering::Relaxed),
            ..MemState::default()
        };
        s.swap_out_bytes = c.swap_out_bytes.load(Ordering::Relaxed);
        s.swap_in_bytes = c.swap_in_bytes.load(Ordering::Relaxed);
        s.swap_out_ns = c.swap_out_ns.load(Ordering::Relaxed);
        s.swap_in_ns = c.swap_in_ns.load(Ordering::Relaxed);
        s.evictions = c.evictions.load(Ordering::Relaxed);
        s.restores = c.restores.load(Ordering::Relaxed);
        s
    }

    /// Counter of the bytes in `p`'s place.
    fn place(&self, p: &Piece) -> &AtomicU64 {
        match p {
            Piece::Resident => &self.counters.resident,
            Piece::Device(_) => &self.counters.device_swap,
            Piece::Host(_) => &self.counters.host_swap,
        }
    }

    /// Replaces piece `i` of `e` with `new`, moving its bytes between the counters.
    fn set_piece(&self, e: &Entry, pieces: &mut [Piece], i: usize, new: Piece) -> Piece {
        let (_, len) = e.piece(i);
        self.place(&pieces[i]).fetch_sub(len, Ordering::Relaxed);
        self.place(&new).fetch_add(len, Ordering::Relaxed);
        std::mem::replace(&mut pieces[i], new)
    }

    /// Tells the broker the state, the physical allocations of the virtual memory API
    /// counted as resident (they are never swapped).
    fn report(&self) {
        let mut s = self.state();
        let vmm = self.vmm_bytes();
        s.used = s.used.saturating_add(vmm);
        s.resident = s.resident.saturating_add(vmm);
        self.broker.report(s);
    }

    fn next_tick(&self) -> u64 {
        self.tick.fetch_add(1, Ordering::Relaxed)
    }

    /// Pins the allocation holding `[addr, addr + len)`; its offset of `addr`.
    fn pin(&self, addr: u64, len: u64) -> Result<(Pin, u64)> {
        let bad = BackendError::BadPointer { addr, len };
        let e = {
            let entries = read(&self.entries);
            let (_, e) = entries.range(..=addr).next_back().ok_or(bad)?;
            e.clone()
        };
        let off = addr - e.addr;
        match off.checked_add(len) {
            Some(end) if off < e.size && end <= e.size => {}
            _ => return Err(BackendError::BadPointer { addr, len }),
        }
        Ok((Pin::new(e, self.next_tick()), off))
    }

    /// Makes the pieces of `e` overlapping `[off, off + len)` resident. Pieces that lie
    /// wholly inside `overwrite` get device memory back but not their old bytes (the
    /// caller is about to overwrite them).
    fn make_resident(
        &self,
        e: &Entry,
        off: u64,
        len: u64,
        overwrite: Option<(u64, u64)>,
    ) -> Result<()> {
        if e.shared {
            return Ok(());
        }
        let mut pieces = e.lock();
        let wanted = e.pieces_of(off, len);
        let missing: u64 = wanted
            .clone()
            .filter(|i| !matches!(pieces[*i], Piece::Resident))
            .map(|i| e.piece(i).1)
            .sum();
        if missing == 0 {
            return Ok(());
        }
        let t = Instant::now();
        self.broker
            .reserve(missing)
            .map_err(|why| BackendError::MemoryPressure {
                requested: missing,
                why,
            })
            .inspect_err(|_| tracing::debug!(addr = e.addr, missing, "restore refused"))?;
        let mut moved = 0;
        let result = (|| {
            for i in wanted {
                if matches!(pieces[i], Piece::Resident) {
                    continue;
                }
                let (poff, plen) = e.piece(i);
                require_paging(&*self.inner)?.recommit(e.addr, poff, plen)?;
                let dlen = e.data_len(i);
                let whole = overwrite.is_some_and(|(o, l)| o <= poff && poff + dlen <= o + l);
                let old = self.set_piece(e, &mut pieces, i, Piece::Resident);
                match old {
                    Piece::Device(buf) => {
                        if !whole {
                            self.inner.copy_dtod(e.addr + poff, buf, dlen)?;
                            moved += dlen;
                        }
                        if let Err(err) = self.inner.free(buf) {
                            tracing::warn!(error = %err, "freeing a swap buffer failed");
                        }
                    }
                    Piece::Host(bytes) => {
                        if !whole {
                            let n = (dlen as usize).min(bytes.len());
                            let mut bytes = bytes;
                            // SAFETY: `bytes` is a live heap buffer we own exclusively
                            // for this call; the slice covers `n <= len` of its bytes.
                            let src = unsafe { VolatileSlice::new(bytes.as_mut_ptr(), n) };
                            self.inner.copy_htod(e.addr + poff, &src)?;
                            moved += dlen;
                        }
                    }
                    Piece::Resident => {}
                }
                self.counters.restores.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        })();
        drop(pieces);
        self.counters
            .swap_in_bytes
            .fetch_add(moved, Ordering::Relaxed);
        self.counters
            .swap_in_ns
            .fetch_add(ns_since(t), Ordering::Relaxed);
        self.report();
        if let Err(err) = &result {
            tracing::error!(addr = e.addr, error = %err, "restoring swapped device memory failed");
        }
        result
    }

    /// Evicts at least `want` bytes (when that much is idle) of this vGPU's resident
    /// memory to `tier`; returns the bytes freed. Gdev's choice: the smallest idle
    /// allocation that covers `want` on its own, else the least recently used ones.
    pub fn evict(&self, want: u64, tier: Tier) -> u64 {
        let _swapping = crate::sync::lock(&self.swapping);
        let candidates: Vec<Arc<Entry>> = {
            let entries = read(&self.entries);
            entries
                .values()
                .filter(|e| !e.shared && !e.pinned())
                .cloned()
                .collect()
        };
        let resident = |e: &Entry| -> u64 {
            e.try_lock().map_or(0, |p| {
                p.iter()
                    .enumerate()
                    .filter(|(_, p)| matches!(p, Piece::Resident))
                    .map(|(i, _)| e.piece(i).1)
                    .sum()
            })
        };
        let mut sized: Vec<(u64, Arc<Entry>)> = candidates
            .into_iter()
            .map(|e| (resident(&e), e))
            .filter(|(r, _)| *r > 0)
            .collect();
        let order: Vec<Arc<Entry>> = match sized
            .iter()
            .filter(|(r, _)| *r >= want)
            .min_by_key(|(r, _)| *r)
        {
            Some((_, e)) => vec![e.clone()],
            None => {
                sized.sort_by_key(|(_, e)| e.last_use.load(Ordering::Relaxed));
                sized.into_iter().map(|(_, e)| e).collect()
            }
        };
        let t = Instant::now();
        let mut freed = 0;
        for e in order {
            if freed >= want {
                break;
            }
            freed += self.evict_entry(&e, want - freed, tier);
        }
        self.counters
            .swap_out_ns
            .fetch_add(ns_since(t), Ordering::Relaxed);
        tracing::debug!(want, freed, ?tier, "evicted");
        self.report();
        freed
    }

    /// Evicts up to `want` bytes of `e`'s resident pieces; the bytes freed.
    fn evict_entry(&self, e: &Entry, want: u64, tier: Tier) -> u64 {
        let Some(mut pieces) = e.try_lock() else {
            return 0;
        };
        if e.pinned() {
            return 0;
        }
        let all = 0..pieces.len();
        self.evict_pieces(e, &mut pieces, all, want, tier)
    }

    /// Evicts up to `want` bytes of the resident pieces `range` of `e` (whose piece table
    /// the caller holds); the bytes freed.
    fn evict_pieces(
        &self,
        e: &Entry,
        pieces: &mut [Piece],
        range: std::ops::Range<usize>,
        want: u64,
        tier: Tier,
    ) -> u64 {
        let mut freed = 0;
        for i in range {
            if freed >= want {
                break;
            }
            if !matches!(pieces[i], Piece::Resident) {
                continue;
            }
            let (off, len) = e.piece(i);
            match self.save(e.addr + off, e.data_len(i), tier) {
                Ok(saved) => {
                    if let Err(err) =
                        require_paging(&*self.inner).and_then(|p| p.decommit(e.addr, off, len))
                    {
                        tracing::error!(addr = e.addr, off, error = %err, "decommit failed; the piece stays resident");
                        self.discard(saved);
                        continue;
                    }
                    self.set_piece(e, pieces, i, saved);
                    freed += len;
                    self.counters
                        .swap_out_bytes
                        .fetch_add(e.data_len(i), Ordering::Relaxed);
                    self.counters.evictions.fetch_add(1, Ordering::Relaxed);
                }
                Err(err) => {
                    tracing::warn!(addr = e.addr, off, error = %err, "saving a piece failed; it stays resident");
                }
            }
        }
        freed
    }

    /// Copies `len` device bytes at `addr` to `tier` (host memory when the swap area
    /// cannot take them).
    fn save(&self, addr: u64, len: u64, tier: Tier) -> Result<Piece> {
        if tier == Tier::Device {
            match self.inner.alloc(len) {
                Ok(buf) => match self.inner.copy_dtod(buf.addr, addr, len) {
                    Ok(_) => return Ok(Piece::Device(buf.addr)),
                    Err(e) => {
                        let _ = self.inner.free(buf.addr);
                        tracing::warn!(error = %e, "copy into the swap area failed; using host memory");
                    }
                },
                Err(e) => tracing::debug!(error = %e, "no swap-area buffer; using host memory"),
            }
        }
        let n = usize::try_from(len)
            .map_err(|_| BackendError::InvalidArgument(format!("piece of {len} bytes")))?;
        let mut bytes = vec![0u8; n].into_boxed_slice();
        // SAFETY: `bytes` is a live heap buffer of `n` bytes owned by this frame.
        let dst = unsafe { VolatileSlice::new(bytes.as_mut_ptr(), n) };
        self.inner.copy_dtoh(addr, &dst)?;
        Ok(Piece::Host(bytes))
    }

    fn discard(&self, p: Piece) {
        if let Piece::Device(buf) = p {
            let _ = self.inner.free(buf);
        }
    }

    /// Moves at least `want` bytes (as far as idle pieces allow) from the swap area to
    /// host memory; returns the bytes moved.
    pub fn spill(&self, want: u64) -> u64 {
        let _swapping = crate::sync::lock(&self.swapping);
        let mut entries: Vec<Arc<Entry>> = {
            let t = read(&self.entries);
            t.values().filter(|e| !e.shared).cloned().collect()
        };
        entries.sort_by_key(|e| e.last_use.load(Ordering::Relaxed));
        let t = Instant::now();
        let mut moved = 0;
        for e in entries {
            if moved >= want {
                break;
            }
            let Some(mut pieces) = e.try_lock() else {
                continue;
            };
            for i in 0..pieces.len() {
                if moved >= want {
                    break;
                }
                let Piece::Device(buf) = pieces[i] else {
                    continue;
                };
                let (_, len) = e.piece(i);
                match self.save(buf, e.data_len(i), Tier::Host) {
                    Ok(p) => {
                        self.set_piece(&e, &mut pieces, i, p);
                        let _ = self.inner.free(buf);
                        moved += len;
                    }
                    Err(err) => tracing::warn!(error = %err, "spilling a swap buffer failed"),
                }
            }
        }
        self.counters
            .swap_out_ns
            .fetch_add(ns_since(t), Ordering::Relaxed);
        self.report();
        moved
    }

    /// Makes every allocation resident (a launch whose arguments may reach any of them).
    /// Makes what kernels with arguments `args` may touch resident and pins it: the
    /// allocations their pointers point into, or every allocation when a 64-bit integer
    /// inside the address space may be a raw device pointer (a PTX kernel's).
    fn pin_launch<'a>(&self, args: impl Iterator<Item = &'a ArgValue> + Clone) -> Result<Vec<Pin>> {
        let info = self.inner.info();
        let va = info.va_base..info.va_base.saturating_add(info.va_size);
        let raw = args
            .clone()
            .any(|a| matches!(a, ArgValue::U64(v) if va.contains(v)));
        if raw {
            return self.pin_all();
        }
        let mut pins = Vec::new();
        for a in args {
            if let ArgValue::Ptr { addr, .. } = a {
                // An address outside every allocation is the inner backend's to reject,
                // with its own message.
                if let Ok((p, _)) = self.pin(*addr, 0) {
                    self.make_resident(&p.0, 0, p.0.charged, None)?;
                    pins.push(p);
                }
            }
        }
        Ok(pins)
    }

    fn pin_all(&self) -> Result<Vec<Pin>> {
        let all: Vec<Arc<Entry>> = {
            let t = read(&self.entries);
            t.values().cloned().collect()
        };
        let tick = self.next_tick();
        let pins: Vec<Pin> = all.into_iter().map(|e| Pin::new(e, tick)).collect();
        for p in &pins {
            self.make_resident(&p.0, 0, p.0.charged, None)?;
        }
        Ok(pins)
    }

    fn insert(&self, e: Entry) {
        write(&self.entries).insert(e.addr, Arc::new(e));
    }
}

impl Pager {
    /// True if `[addr, addr + len)` lies inside one module variable the guest looked up or
    /// one device-mapped host region: memory the pager never swaps.
    fn in_global(&self, addr: u64, len: u64) -> bool {
        let host = crate::sync::lock(&self.host_mapped);
        if usize::try_from(addr).is_ok_and(|a| {
            usize::try_from(len).is_ok_and(|l| {
                a.checked_add(l)
                    .is_some_and(|e| host.iter().any(|r| a >= r.addr && e <= r.addr + r.len))
            })
        }) {
            return true;
        }
        drop(host);
        let globals = crate::sync::lock(&self.globals);
        let Some((start, (size, _))) = globals.range(..=addr).next_back() else {
            return false;
        };
        let end = start.saturating_add(*size);
        addr < end && addr.checked_add(len).is_some_and(|e| e <= end)
    }
}

impl Backend for Pager {
    fn memory_usage(&self) -> MemoryUsage {
        let s = self.state();
        let allocations = read(&self.entries).len() as u64;
        MemoryUsage {
            used: s.used.saturating_add(self.fixed_bytes()),
            capacity: self.share,
            allocations,
        }
    }

    fn alloc(&self, size: u64) -> Result<Allocated> {
        if size == 0 {
            return Err(BackendError::ZeroSize);
        }
        let g = self.inner.info().alloc_granularity.max(1);
        let charge =
            size.checked_add(g - 1)
                .map(|v| v / g * g)
                .ok_or(BackendError::OutOfMemory {
                    requested: size,
                    available: 0,
                    capacity: self.share,
                })?;
        let used = self.state().used.saturating_add(self.fixed_bytes());
        if used.saturating_add(charge) > self.share {
            return Err(BackendError::OutOfMemory {
                requested: charge,
                available: self.share.saturating_sub(used),
                capacity: self.share,
            });
        }
        if let Err(why) = self.broker.reserve(charge) {
            tracing::info!(size, why, "allocation refused by the memory broker");
            self.report();
            return Err(BackendError::MemoryPressure {
                requested: charge,
                why,
            });
        }
        let a = match self.inner.alloc(size) {
            Ok(a) => a,
            Err(e) => {
                self.report();
                return Err(e);
            }
        };
        let mut e = Entry::new(a.addr, size, a.charged, self.granule, false);
        e.last_use = AtomicU64::new(self.next_tick());
        self.counters.used.fetch_add(a.charged, Ordering::Relaxed);
        self.counters
            .resident
            .fetch_add(a.charged, Ordering::Relaxed);
        self.insert(e);
        self.report();
        Ok(a)
    }

    fn free(&self, addr: u64) -> Result<()> {
        if self.is_mapping(addr) {
            // A mapping goes with MEM_UNMAP, not FREE.
            return Err(BackendError::NotAllocated { addr });
        }
        let e = write(&self.entries)
            .remove(&addr)
            .ok_or(BackendError::NotAllocated { addr })?;
        if !e.shared {
            let mut pieces = e.lock();
            for i in 0..pieces.len() {
                if let Piece::Device(buf) = self.set_piece(&e, &mut pieces, i, Piece::Resident) {
                    let _ = self.inner.free(buf);
                }
            }
            self.counters.used.fetch_sub(e.charged, Ordering::Relaxed);
            self.counters
                .resident
                .fetch_sub(e.charged, Ordering::Relaxed);
        }
        let r = self.inner.free(addr);
        self.report();
        r
    }

    fn check_range(&self, addr: u64, len: u64) -> Result<()> {
        if self.in_global(addr, len) {
            return self.inner.check_range(addr, len);
        }
        self.pin(addr, len).map(|_| ())
    }

    fn copy_htod(&self, dst: u64, src: &VolatileSlice<'_>) -> Result<u64> {
        let len = src.len() as u64;
        if self.in_global(dst, len) {
            return self.inner.copy_htod(dst, src);
        }
        let (pin, off) = self.pin(dst, len)?;
        self.make_resident(&pin.0, off, len, Some((off, len)))?;
        self.inner.copy_htod(dst, src)
    }

    fn copy_dtoh(&self, src: u64, dst: &VolatileSlice<'_>) -> Result<u64> {
        let len = dst.len() as u64;
        if self.in_global(src, len) {
            return self.inner.copy_dtoh(src, dst);
        }
        let (pin, off) = self.pin(src, len)?;
        self.read_pieces(&*self.inner, &pin.0, off, dst, None)
    }

    fn copy_dtod(&self, dst: u64, src: u64, len: u64) -> Result<u64> {
        let mut pins = Vec::with_capacity(2);
        if !self.in_global(src, len) {
            let (sp, so) = self.pin(src, len)?;
            self.make_resident(&sp.0, so, len, None)?;
            pins.push(sp);
        }
        if !self.in_global(dst, len) {
            let (dp, doff) = self.pin(dst, len)?;
            self.make_resident(&dp.0, doff, len, Some((doff, len)))?;
            pins.push(dp);
        }
        self.inner.copy_dtod(dst, src, len)
    }

    fn memset(&self, dst: u64, value: u32, elem_size: u32, count: u64) -> Result<u64> {
        let len = count.saturating_mul(u64::from(elem_size));
        if self.in_global(dst, len) {
            return self.inner.memset(dst, value, elem_size, count);
        }
        let (pin, off) = self.pin(dst, len)?;
        self.make_resident(&pin.0, off, len, Some((off, len)))?;
        self.inner.memset(dst, value, elem_size, count)
    }

    fn launch(&self, launches: &[Launch<'_>]) -> Vec<Result<LaunchStats>> {
        // Everything the kernels may touch, resident and pinned for the whole call; when
        // that cannot be had at once, the launches run one by one, each with its own pins.
        match self.pin_launch(launches.iter().flat_map(|l| l.args.iter())) {
            Ok(_pins) => self.inner.launch(launches),
            Err(e) if launches.len() == 1 => vec![Err(e)],
            Err(_) => launches
                .iter()
                .map(|l| {
                    let _pins = self.pin_launch(l.args.iter())?;
                    one_result(self.inner.launch(std::slice::from_ref(l)))
                })
                .collect(),
        }
    }

    fn modules(&self) -> &dyn Modules {
        self
    }

    fn shared_memory(&self) -> Option<&dyn SharedMemory> {
        self.inner
            .shared_memory()
            .map(|_| self as &dyn SharedMemory)
    }

    fn paging(&self) -> Option<&dyn Paging> {
        self.inner.paging().map(|_| self as &dyn Paging)
    }

    fn relocation(&self) -> Option<&dyn Relocatable> {
        self.inner.relocation().map(|_| self as &dyn Relocatable)
    }

    fn virtual_memory(&self) -> Option<&dyn crate::VirtualMemory> {
        self.inner
            .virtual_memory()
            .map(|_| self as &dyn crate::VirtualMemory)
    }

    fn host_memory(&self) -> Option<&dyn crate::HostMemory> {
        self.inner
            .host_memory()
            .map(|_| self as &dyn crate::HostMemory)
    }

    crate::forward_backend!(inner: info, synchronize);
}
