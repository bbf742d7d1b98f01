//! CUDA's virtual memory management on a vGPU ([`VirtualMemory`](crate::VirtualMemory)):
//! the book-keeping every backend shares. Reserved address ranges come out of the same
//! free holes as allocations (so they never overlap one), a physical allocation is charged
//! to the vGPU's memory like `alloc` and lives while a handle reference or a mapping holds
//! it, and a mapping is an ordinary entry of the backend's allocation table at its address
//! (copies, memsets, kernel pointers and pointer checks see it like any allocation) that
//! `free` refuses. Every argument is checked here before a backend touches anything.
//!
//! A mapping keeps its part of its reserved range taken until its last user lets go (a
//! running kernel or copy holds the table's `Arc`), so a range is never mapped twice at
//! once; a reserved range returns to the free holes once it is freed and its last mapping
//! is gone.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::sync::lock;
use crate::{BackendError, Result};

/// Sizes, addresses and alignments of the virtual memory operations are multiples of this.
pub const GRANULARITY: u64 = vgpu_proto::VMM_GRANULARITY;

/// Most reserved ranges, physical allocations and mappings a vGPU may hold at once, each
/// (they cost worker memory; the address space and the share bound them too).
pub const MAX_OBJECTS: usize = 1 << 16;

/// A reserved range of device addresses.
pub(crate) struct VaRange {
    addr: u64,
    size: u64,
    /// Mapped parts (start -> length), held until their last user lets go.
    occupied: Mutex<BTreeMap<u64, u64>>,
    /// Gives the range back to the free holes (called once, when the range goes).
    on_drop: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for VaRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VaRange")
            .field("addr", &self.addr)
            .field("size", &self.size)
            .finish()
    }
}

impl Drop for VaRange {
    fn drop(&mut self) {
        if let Some(give_back) = lock(&self.on_drop).take() {
            give_back();
        }
        tracing::trace!(
            addr = self.addr,
            size = self.size,
            "reserved range returned"
        );
    }
}

/// What a mapping's allocation-table entry holds: its part of the reserved range (given
/// back when the entry goes) and its physical memory (kept alive while mapped).
pub(crate) struct MapGuard {
    range: Arc<VaRange>,
    addr: u64,
    _phys: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for MapGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapGuard")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Drop for MapGuard {
    fn drop(&mut self) {
        lock(&self.range.occupied).remove(&self.addr);
    }
}

/// A backend's physical allocation.
pub(crate) trait Physical: Any + Send + Sync {
    /// Its size in bytes.
    fn size(&self) -> u64;
    /// Bytes it charges to the vGPU's memory.
    fn charged(&self) -> u64;
}

/// What a backend provides to the shared book-keeping.
pub(crate) trait VmmHost {
    /// The backend's physical allocation.
    type Phys: Physical;

    /// The vGPU's address space `(va_base, va_size)`.
    fn space(&self) -> (u64, u64);

    /// Takes `off..off + len` of the address space's free holes if free.
    fn take_hole_at(&self, off: u64, len: u64) -> bool;

    /// Takes the first free `len` bytes whose address is a multiple of `align`; the offset.
    fn take_hole_aligned(&self, len: u64, align: u64) -> Option<u64>;

    /// What gives `off..off + len` back to the free holes, called once when the reserved
    /// range goes.
    fn give_hole_later(&self, off: u64, len: u64) -> Box<dyn FnOnce() + Send>;

    /// Creates `size` bytes of zeroed physical memory charged to the vGPU (refused with
    /// `OutOfMemory` past its capacity).
    fn create_phys(&self, size: u64) -> Result<Self::Phys>;

    /// Maps `phys` (from its offset 0) over `[addr, addr + len)`, a free part of a
    /// reserved range, and lists it in the allocation table with `guard`.
    fn place(&self, addr: u64, len: u64, phys: &Arc<Self::Phys>, guard: MapGuard) -> Result<()>;

    /// Takes the mapping at `addr` out of the allocation table (its memory is unmapped
    /// when its last user lets go).
    fn remove(&self, addr: u64) -> Result<()>;
}

/// One mapping.
struct MapRec<P> {
    len: u64,
    handle: u64,
    phys: Arc<P>,
}

struct State<P> {
    ranges: BTreeMap<u64, Arc<VaRange>>,
    /// Live handles: the allocation and its references.
    handles: BTreeMap<u64, (Arc<P>, u64)>,
    maps: BTreeMap<u64, MapRec<P>>,
    next_handle: u64,
    /// Live allocations that have been mapped (their bytes may differ from zero).
    ever_mapped: std::collections::BTreeSet<u64>,
}

impl<P> State<P> {
    /// Forgets what is kept of allocation `handle` once neither a reference nor a
    /// mapping holds it.
    fn forget_if_gone(&mut self, handle: u64) {
        if !self.handles.contains_key(&handle) && !self.maps.values().any(|m| m.handle == handle) {
            self.ever_mapped.remove(&handle);
        }
    }
}

/// A vGPU's reserved ranges, physical allocations and mappings.
pub(crate) struct Vmm<P> {
    state: Mutex<State<P>>,
}

impl<P> std::fmt::Debug for Vmm<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = lock(&self.state);
        f.debug_struct("Vmm")
            .field("ranges", &s.ranges.len())
            .field("handles", &s.handles.len())
            .field("maps", &s.maps.len())
            .finish()
    }
}

impl<P> Default for Vmm<P> {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                ranges: BTreeMap::new(),
                handles: BTreeMap::new(),
                maps: BTreeMap::new(),
                // Handles are never reused, and never 0.
                next_handle: 1,
                ever_mapped: Default::default(),
            }),
        }
    }
}

fn invalid(why: String) -> BackendError {
    BackendError::InvalidArgument(why)
}

/// Checks that `v` (named `what`) is a non-zero multiple of the granularity.
fn granular(what: &str, v: u64) -> Result<()> {
    if v == 0 || v % GRANULARITY != 0 {
        return Err(invalid(format!(
            "{what} {v:#x} must be a non-zero multiple of the allocation granularity {GRANULARITY:#x} (cuMemGetAllocationGranularity)"
        )));
    }
    Ok(())
}

fn too_many(what: &'static str) -> BackendError {
    BackendError::TooMany {
        what,
        limit: MAX_OBJECTS,
    }
}

impl<P: Physical> Vmm<P> {
    /// Reserves `size` bytes of addresses aligned to `align` (0: the granularity), at
    /// `hint` when that range is free and aligned.
    pub fn reserve<H: VmmHost<Phys = P>>(
        &self,
        host: &H,
        size: u64,
        align: u64,
        hint: u64,
    ) -> Result<u64> {
        granular("reserved size", size)?;
        let align = if align == 0 { GRANULARITY } else { align };
        if !align.is_power_of_two() || align % GRANULARITY != 0 {
            return Err(invalid(format!(
                "alignment {align:#x} must be a power of two and a multiple of {GRANULARITY:#x}"
            )));
        }
        let mut s = lock(&self.state);
        if s.ranges.len() >= MAX_OBJECTS {
            return Err(too_many("reserved address ranges"));
        }
        let (base, va_size) = host.space();
        if size > va_size {
            return Err(BackendError::AddressSpaceFull { requested: size });
        }
        let at_hint = (hint != 0 && hint % align == 0)
            .then(|| hint.checked_sub(base))
            .flatten()
            .filter(|off| host.take_hole_at(*off, size));
        let off = match at_hint {
            Some(off) => off,
            None => host
                .take_hole_aligned(size, align)
                .ok_or(BackendError::AddressSpaceFull { requested: size })?,
        };
        let addr = base + off;
        let range = Arc::new(VaRange {
            addr,
            size,
            occupied: Mutex::new(BTreeMap::new()),
            on_drop: Mutex::new(Some(host.give_hole_later(off, size))),
        });
        s.ranges.insert(addr, range);
        tracing::debug!(addr, size, align, hint, "address range reserved");
        Ok(addr)
    }

    /// Frees the reserved range `[addr, addr + size)` (exactly as reserved) once no
    /// mapping is left in it.
    pub fn free_range(&self, addr: u64, size: u64) -> Result<()> {
        let mut s = lock(&self.state);
        let Some(r) = s.ranges.get(&addr) else {
            return Err(invalid(format!(
                "{addr:#x} is not the start of a reserved address range (cuMemAddressReserve)"
            )));
        };
        if r.size != size {
            return Err(invalid(format!(
                "the range at {addr:#x} was reserved with {:#x} bytes, not {size:#x}; free it whole",
                r.size
            )));
        }
        let end = addr + size;
        if s.maps.range(addr..end).next().is_some() {
            return Err(invalid(format!(
                "the range at {addr:#x} still has mappings; unmap them first (cuMemUnmap)"
            )));
        }
        let r = s.ranges.remove(&addr);
        drop(s);
        drop(r);
        tracing::debug!(addr, size, "reserved range freed");
        Ok(())
    }

    /// Creates a physical allocation of `size` bytes; its handle and the bytes charged.
    pub fn create<H: VmmHost<Phys = P>>(&self, host: &H, size: u64) -> Result<(u64, u64)> {
        granular("allocation size", size)?;
        let mut s = lock(&self.state);
        if s.handles.len() >= MAX_OBJECTS {
            return Err(too_many("physical allocations"));
        }
        let p = host.create_phys(size)?;
        let charged = p.charged();
        let handle = s.next_handle;
        s.next_handle += 1;
        s.handles.insert(handle, (Arc::new(p), 1));
        tracing::debug!(handle, size, charged, "physical allocation created");
        Ok((handle, charged))
    }

    /// Drops one reference to `handle`.
    pub fn release(&self, handle: u64) -> Result<()> {
        let mut s = lock(&self.state);
        let Some((_, refs)) = s.handles.get_mut(&handle) else {
            return Err(invalid(format!(
                "{handle:#x} is not a live allocation handle of this vGPU (already released?)"
            )));
        };
        *refs -= 1;
        let gone = (*refs == 0).then(|| s.handles.remove(&handle));
        if gone.is_some() {
            s.forget_if_gone(handle);
        }
        drop(s);
        drop(gone);
        Ok(())
    }

    /// Maps `size` bytes of `handle`'s allocation from `offset` at `addr`.
    pub fn map<H: VmmHost<Phys = P>>(
        &self,
        host: &H,
        addr: u64,
        size: u64,
        offset: u64,
        handle: u64,
    ) -> Result<()> {
        granular("mapping address", addr)?;
        granular("mapping size", size)?;
        if offset != 0 {
            return Err(invalid(format!(
                "offset {offset:#x} into the allocation must be 0 (as the CUDA driver requires)"
            )));
        }
        let end = addr
            .checked_add(size)
            .ok_or_else(|| invalid(format!("mapping {addr:#x}+{size:#x} wraps around")))?;
        let mut s = lock(&self.state);
        if s.maps.len() >= MAX_OBJECTS {
            return Err(too_many("mappings"));
        }
        let phys = match s.handles.get(&handle) {
            Some((p, _)) => p.clone(),
            None => {
                return Err(invalid(format!(
                    "{handle:#x} is not a live allocation handle of this vGPU"
                )))
            }
        };
        if size > phys.size() {
            return Err(invalid(format!(
                "mapping {size:#x} bytes of an allocation of {:#x}",
                phys.size()
            )));
        }
        let range = s
            .ranges
            .range(..=addr)
            .next_back()
            .map(|(_, r)| r.clone())
            .filter(|r| end <= r.addr + r.size)
            .ok_or_else(|| {
                invalid(format!(
                    "{addr:#x}+{size:#x} is not inside one reserved address range (cuMemAddressReserve)"
                ))
            })?;
        {
            let mut occ = lock(&range.occupied);
            let before = occ
                .range(..=addr)
                .next_back()
                .is_some_and(|(a, l)| a + l > addr);
            if before || occ.range(addr..end).next().is_some() {
                return Err(invalid(format!(
                    "{addr:#x}+{size:#x} overlaps a mapping (unmap it first; one still in use by running work is released when that work ends)"
                )));
            }
            occ.insert(addr, size);
        }
        let erased: Arc<dyn Any + Send + Sync> = phys.clone();
        let guard = MapGuard {
            range,
            addr,
            _phys: erased,
        };
        host.place(addr, size, &phys, guard)?;
        s.ever_mapped.insert(handle);
        s.maps.insert(
            addr,
            MapRec {
                len: size,
                handle,
                phys,
            },
        );
        tracing::debug!(addr, size, handle, "mapped");
        Ok(())
    }

    /// Unmaps every mapping inside `[addr, addr + size)`; there is at least one and none
    /// is cut.
    pub fn unmap<H: VmmHost<Phys = P>>(&self, host: &H, addr: u64, size: u64) -> Result<()> {
        let end = addr
            .checked_add(size)
            .filter(|_| size > 0)
            .ok_or_else(|| invalid(format!("unmap range {addr:#x}+{size:#x}")))?;
        let mut s = lock(&self.state);
        let cut = s
            .maps
            .range(..addr)
            .next_back()
            .is_some_and(|(a, m)| a + m.len > addr);
        let inside: Vec<(u64, u64)> = s.maps.range(addr..end).map(|(a, m)| (*a, m.len)).collect();
        if cut || inside.iter().any(|(a, l)| a + l > end) {
            return Err(invalid(format!(
                "{addr:#x}+{size:#x} cuts a mapping; unmap whole mappings"
            )));
        }
        if inside.is_empty() {
            return Err(invalid(format!("nothing is mapped in {addr:#x}+{size:#x}")));
        }
        let mut gone = Vec::with_capacity(inside.len());
        for (a, _) in inside {
            host.remove(a)?;
            gone.extend(s.maps.remove(&a));
        }
        for m in &gone {
            s.forget_if_gone(m.handle);
        }
        drop(s);
        drop(gone);
        tracing::debug!(addr, size, "unmapped");
        Ok(())
    }

    /// The handle of the allocation mapped at `addr` with one more reference: (handle,
    /// allocation size, mapping start, mapping size).
    pub fn retain(&self, addr: u64) -> Result<[u64; 4]> {
        let mut s = lock(&self.state);
        let (start, len, handle, phys) = s
            .maps
            .range(..=addr)
            .next_back()
            .filter(|(a, m)| addr < *a + m.len)
            .map(|(a, m)| (*a, m.len, m.handle, m.phys.clone()))
            .ok_or_else(|| invalid(format!("nothing is mapped at {addr:#x}")))?;
        let size = phys.size();
        s.handles
            .entry(handle)
            .and_modify(|(_, refs)| *refs += 1)
            .or_insert((phys, 1));
        Ok([handle, size, start, len])
    }

    /// What a migration needs to rebuild this state elsewhere.
    pub fn snapshot(&self) -> Result<crate::VmmSnapshot> {
        let s = lock(&self.state);
        let mut allocations: BTreeMap<u64, (u64, u64)> = s
            .handles
            .iter()
            .map(|(h, (p, refs))| (*h, (p.size(), *refs)))
            .collect();
        for m in s.maps.values() {
            allocations.entry(m.handle).or_insert((m.phys.size(), 0));
        }
        let mapped: std::collections::BTreeSet<u64> = s.maps.values().map(|m| m.handle).collect();
        if let Some(h) = s
            .ever_mapped
            .iter()
            .find(|h| allocations.contains_key(h) && !mapped.contains(h))
        {
            return Err(BackendError::NotSupported(format!(
                "physical allocation {h:#x} holds bytes but is mapped nowhere, so a migration cannot copy them; map it (cuMemMap) or release it before migrating"
            )));
        }
        Ok(crate::VmmSnapshot {
            ranges: s.ranges.values().map(|r| (r.addr, r.size)).collect(),
            allocations: allocations
                .into_iter()
                .map(|(h, (size, refs))| (h, size, refs))
                .collect(),
            maps: s.maps.iter().map(|(a, m)| (*a, m.len, m.handle)).collect(),
            next_handle: s.next_handle,
        })
    }

    /// Rebuilds `snap` here (nothing held yet): the same ranges, handles and mappings.
    pub fn restore<H: VmmHost<Phys = P>>(&self, host: &H, snap: &crate::VmmSnapshot) -> Result<()> {
        let mut s = lock(&self.state);
        if !(s.ranges.is_empty() && s.handles.is_empty() && s.maps.is_empty()) {
            return Err(invalid(
                "a backend that holds virtual memory objects cannot take another's".into(),
            ));
        }
        let (base, _) = host.space();
        for &(addr, size) in &snap.ranges {
            let off = addr
                .checked_sub(base)
                .filter(|off| host.take_hole_at(*off, size));
            let Some(off) = off else {
                return Err(invalid(format!(
                    "the reserved range {addr:#x}+{size:#x} is not free here"
                )));
            };
            let range = Arc::new(VaRange {
                addr,
                size,
                occupied: Mutex::new(BTreeMap::new()),
                on_drop: Mutex::new(Some(host.give_hole_later(off, size))),
            });
            s.ranges.insert(addr, range);
        }
        let mut phys = BTreeMap::new();
        for &(handle, size, refs) in &snap.allocations {
            let p = Arc::new(host.create_phys(size)?);
            if refs > 0 {
                s.handles.insert(handle, (p.clone(), refs));
            }
            phys.insert(handle, p);
        }
        for &(addr, size, handle) in &snap.maps {
            let p = phys.get(&handle).cloned().ok_or_else(|| {
                invalid(format!(
                    "mapping {addr:#x} names unknown allocation {handle:#x}"
                ))
            })?;
            let range = s
                .ranges
                .range(..=addr)
                .next_back()
                .map(|(_, r)| r.clone())
                .filter(|r| {
                    addr.checked_add(size)
                        .is_some_and(|end| end <= r.addr + r.size)
                })
                .ok_or_else(|| invalid(format!("mapping {addr:#x} lies in no reserved range")))?;
            lock(&range.occupied).insert(addr, size);
            let erased: Arc<dyn Any + Send + Sync> = p.clone();
            let guard = MapGuard {
                range,
                addr,
                _phys: erased,
            };
            host.place(addr, size, &p, guard)?;
            s.ever_mapped.insert(handle);
            s.maps.insert(
                addr,
                MapRec {
                    len: size,
                    handle,
                    phys: p,
                },
            );
        }
        s.next_handle = s.next_handle.max(snap.next_handle);
        Ok(())
    }

    /// Reserved ranges, live handles and mappings, together.
    pub fn objects(&self) -> usize {
        let s = lock(&self.state);
        s.ranges.len() + s.handles.len() + s.maps.len()
    }

    /// Bytes the live physical allocations charge.
    pub fn charged(&self) -> u64 {
        let s = lock(&self.state);
        let mut seen = std::collections::BTreeSet::new();
        let all = s
            .handles
            .values()
            .map(|(p, _)| p)
            .chain(s.maps.values().map(|m| &m.phys));
        let mut total = 0u64;
        for p in all {
            if seen.insert(Arc::as_ptr(p) as *const () as usize) {
                total = total.saturating_add(p.charged());
            }
        }
        total
    }
}
