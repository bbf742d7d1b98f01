//! The vGPU's device memory through CUDA's virtual memory management API.
//!
//! The whole vGPU address space `[va_base, va_base + va_size)` is reserved once
//! (`cuMemAddressReserve` at that fixed address, the same range the sim backend uses), and
//! each allocation is physical memory (`cuMemCreate`) mapped at its place in it
//! (`cuMemMap`, `cuMemSetAccess`). A device address therefore depends only on the
//! allocator's choice inside our own range, never on the driver: swapping and migration can
//! later unmap the physical memory and map other memory (another GPU's) at the same
//! addresses. Freed ranges are reused only once nothing uses the allocation any more.
//!
//! **Migration in one process.** A migration target (another GPU's backend, created by the
//! same worker) cannot reserve the vGPU's range: the source holds it. It finds the range
//! in [`HOMES`], reserves a staging range of the same size wherever the driver likes and
//! maps its allocations there while pre-copy fills them (with access for the source GPU
//! too, so the copy engines move the bytes peer to peer). At the switch the source unmaps
//! its memory (keeping it, in case the switch fails) and the target unmaps each allocation
//! from staging and maps the same physical memory at the vGPU's own addresses. The
//! reservation itself is shared, so it lives as long as either backend.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock, Weak};

use cudarc::driver::sys;

use super::driver::{check, Context, CuError};
use super::vmm::{access_desc, alloc_prop, can_access_peer, granularity, mem_info};
use crate::error::{BackendError, Result};
use crate::space::{AllocTable, Extent, Ledger};
use crate::sync::{get_mut, lock, read, write};
use crate::virt::{MapGuard, Vmm};
use crate::MemoryUsage;

#[path = "shm.rs"]
mod shm;
#[path = "vmm_space.rs"]
mod vmm_space;
pub(crate) use vmm_space::CudaPhys;
#[path = "reservation.rs"]
mod reservation;
use reservation::{Reservation, HOMES};

/// Alignment of every allocation's device address (and of the address space).
pub const VA_ALIGN: u64 = vgpu_proto::DEVICE_ALLOC_ALIGN;

pub(super) fn round_up(v: u64, align: u64) -> Option<u64> {
    v.checked_add(align - 1).map(|v| v / align * align)
}

/// Where this backend's allocations are mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// At the vGPU's own addresses.
    Home,
    /// In the staging range (a migration target before its switch).
    Staged,
    /// Nowhere (a migration source at its switch): the memory is kept, unmapped.
    Vacated,
}

/// State shared by the address space and its allocations.
#[derive(Debug)]
struct Space {
    /// The vGPU's address range (shared with the other backend during a migration).
    home: Arc<Reservation>,
    /// A migration target's staging range.
    staging: Option<Reservation>,
    place: RwLock<Place>,
    /// Our GPU's context (frees and maps run in it).
    ctx: Arc<Context>,
    granularity: u64,
    ordinal: i32,
    /// GPUs besides ours granted access to staged mappings (the migration source).
    peers: Vec<i32>,
    /// Holes (multiples of `granularity`), charge and count.
    ledger: Ledger,
}

impl Space {
    /// Where the allocation at vGPU address `addr` is mapped when placed at `place`.
    fn va_of(&self, addr: u64, place: Place) -> Option<u64> {
        match (place, &self.staging) {
            (Place::Home, _) => Some(addr),
            (Place::Staged, Some(st)) => Some(st.base + (addr - self.home.base)),
            (Place::Staged, None) | (Place::Vacated, _) => None,
        }
    }

    fn place(&self) -> std::sync::RwLockReadGuard<'_, Place> {
        read(&self.place)
    }

    /// Maps `handle` over `[va, va + len)` with read-write access for our GPU (and, in
    /// staging, for the migration source's GPU).
    fn map(
        &self,
        va: u64,
        len: u64,
        handle: sys::CUmemGenericAllocationHandle,
        staged: bool,
    ) -> std::result::Result<(), CuError> {
        let len_us = len as usize;
        check(
            // SAFETY: maps a live handle of ours over a range of one of our reservations that
            // the caller owns and that nothing else maps.
            unsafe { sys::cuMemMap(va, len_us, 0, handle, 0) },
            "cuMemMap",
        )?;
        let mut desc = vec![access_desc(self.ordinal)];
        if staged {
            desc.extend(self.peers.iter().map(|p| access_desc(*p)));
        }
        let rc = check(
            // SAFETY: sets access on the mapping just made; reads `desc.len()` descriptors.
            unsafe { sys::cuMemSetAccess(va, len_us, desc.as_ptr(), desc.len()) },
            "cuMemSetAccess",
        );
        if let Err(e) = rc {
            // SAFETY: undoes the mapping just made; nothing can have used it.
            let _ = unsafe { sys::cuMemUnmap(va, len_us) };
            return Err(e);
        }
        Ok(())
    }
}

/// The physical memory behind an allocation and where it is mapped.
#[derive(Debug, Default)]
struct Slot {
    /// None while swapped out (decommitted).
    handle: Option<sys::CUmemGenericAllocationHandle>,
    /// Where `handle` is mapped; None while unmapped (decommitted, or vacated at a switch).
    at: Option<u64>,
}

/// One live allocation: physical memory mapped at its place in the reserved range.
#[derive(Debug)]
pub struct Allocation {
    addr: u64,
    size: u64,
    mapped: u64,
    slot: Mutex<Slot>,
    space: Arc<Space>,
    /// A mapping of a shared object (not charged here, never swapped).
    imported: bool,
    /// Mapped without write access for our GPU (a read-only shared object attachment).
    read_only: bool,
    /// A mapping of a physical allocation (virtual memory management): not charged here
    /// (the physical allocation is), never swapped, `free` refuses it; its range belongs
    /// to its reserved range, not to the free holes.
    vmm: Option<MapGuard>,
}

impl Extent for Allocation {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_only(&self) -> bool {
        self.read_only
    }
}

impl Allocation {
    /// Its device address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Where its memory is mapped now (its address, or the staging address of a migration
    /// target); None while swapped out or vacated.
    pub fn va(&self) -> Option<u64> {
        lock(&self.slot).at
    }
}

/// Unmaps `[at, at + len)` (when mapped) and releases `handle`; false if the unmap failed
/// (the range must then never be handed out again).
fn unmap_release(
    ctx: &Context,
    at: Option<u64>,
    len: u64,
    handle: sys::CUmemGenericAllocationHandle,
) -> bool {
    if let Err(e) = ctx.bind() {
        tracing::error!(error = %e, "cannot bind the CUDA context to free device memory");
        return false;
    }
    let mut ok = true;
    if let Some(va) = at {
        if let Err(e) = check(
            // SAFETY: [va, va + len) is exactly one mapping we made with cuMemMap, and
            // nothing uses it any more (every user held the Arc that is being dropped, or
            // the caller holds the allocation's slot lock after draining its work).
            unsafe { sys::cuMemUnmap(va, len as usize) },
            "cuMemUnmap",
        ) {
            tracing::error!(va, error = %e, "unmapping device memory failed; its address range is retired");
            ok = false;
        }
    }
    // SAFETY: releases our own handle from cuMemCreate, once; the physical memory goes away
    // when no mapping uses it.
    if let Err(e) = check(unsafe { sys::cuMemRelease(handle) }, "cuMemRelease") {
        tracing::error!(va = ?at, error = %e, "releasing device memory failed");
    }
    ok
}

impl Drop for Allocation {
    fn drop(&mut self) {
        let slot = std::mem::take(get_mut(&mut self.slot));
        let reusable = match slot.handle {
            Some(h) => unmap_release(&self.space.ctx, slot.at, self.mapped, h),
            None => true,
        };
        // A mapping's addresses go back to its reserved range (its guard), not the holes.
        let hole = (reusable && self.vmm.is_none())
            .then(|| (self.addr - self.space.home.base, self.mapped));
        let charged = if self.imported || self.vmm.is_some() {
            0
        } else {
            self.mapped
        };
        self.space.ledger.released(hole, charged);
        tracing::trace!(addr = self.addr, size = self.size, "device memory released");
    }
}

/// A vGPU's device address space and its allocation table.
#[derive(Debug)]
pub struct DeviceMemory {
    space: Arc<Space>,
    table: AllocTable<Allocation>,
    vmm: Vmm<CudaPhys>,
}

impl DeviceMemory {
    /// Reserves `[va_base, va_base + va_size)` in `ctx` (bound by the caller) for at most
    /// `capacity` bytes of GPU `ordinal`'s memory. A `migration_target` whose range another
    /// backend of this process holds (the vGPU's source) stages its memory elsewhere until
    /// [`DeviceMemory::occupy`].
    pub fn new(
        ctx: &Arc<Context>,
        ordinal: i32,
        va_base: u64,
        va_size: u64,
        capacity: u64,
        migration_target: bool,
    ) -> Result<Self> {
        crate::space::check_layout(va_base, va_size)?;
        let granularity = granularity(ordinal).map_err(dev_err)?;
        let held = if migration_target {
            lock(&HOMES).get(&va_base).and_then(Weak::upgrade)
        } else {
            None
        };
        let (home, staging, place, peers) = match held {
            Some(home) if home.size == va_size => {
                let staging = Reservation::reserve(ctx, ordinal, 0, va_size).map_err(|e| {
                    BackendError::Device(format!(
                        "{e}: cannot reserve {va_size:#x} bytes of address space to stage the migrating vGPU"
                    ))
                })?;
                let source = home.ordinal.load(Ordering::Acquire);
                let peers = if source != ordinal && can_access_peer(source, ordinal) {
                    vec![source]
                } else {
                    Vec::new()
                };
                tracing::debug!(
                    staging = format_args!("{:#x}", staging.base),
                    source,
                    peer_access = !peers.is_empty(),
                    "migration target staged"
                );
                (home, Some(staging), Place::Staged, peers)
            }
            Some(home) => {
                return Err(BackendError::InvalidArgument(format!(
                    "the migrating vGPU's address space is {:#x} bytes, the target asked {va_size:#x}",
                    home.size
                )));
            }
            None => (
                Self::reserve_home(ctx, ordinal, va_base, va_size)?,
                None,
                Place::Home,
                Vec::new(),
            ),
        };
        tracing::debug!(
            va_base = format_args!("{va_base:#x}"),
            va_size,
            granularity,
            ?place,
            "vGPU address space reserved"
        );
        Ok(Self {
            space: Arc::new(Space {
                home,
                staging,
                place: RwLock::new(place),
                ctx: ctx.clone(),
                granularity,
                ordinal,
                peers,
                ledger: Ledger::new(va_size / granularity * granularity, capacity),
            }),
            table: AllocTable::default(),
            vmm: Vmm::default(),
        })
    }

    /// Reserves the vGPU's own range at exactly `va_base` and lists it in [`HOMES`].
    fn reserve_home(
        ctx: &Arc<Context>,
        ordinal: i32,
        va_base: u64,
        va_size: u64,
    ) -> Result<Arc<Reservation>> {
        let mut res = Reservation::reserve(ctx, ordinal, va_base, va_size).map_err(|e| {
            BackendError::Device(format!(
                "{e}: cannot reserve the vGPU address space {va_base:#x}+{va_size:#x}; pick a smaller or another range"
            ))
        })?;
        if res.base != va_base {
            let got = res.base;
            drop(res);
            return Err(BackendError::Device(format!(
                "the driver placed the vGPU address space at {got:#x} instead of {va_base:#x} (the range is \
                 taken in this process); pick another va_base"
            )));
        }
        res.home = true;
        let res = Arc::new(res);
        lock(&HOMES).insert(va_base, Arc::downgrade(&res));
        Ok(res)
    }

    /// Allocation granularity (sizes are charged rounded up to it).
    pub fn granularity(&self) -> u64 {
        self.space.granularity
    }

    /// The address space's accounts.
    pub fn usage(&self) -> MemoryUsage {
        self.space.ledger.usage()
    }

    /// The address space's accounts, which loaded modules are charged to as well.
    pub(crate) fn ledger(&self) -> &Ledger {
        &self.space.ledger
    }

    /// Whether the memory is at the vGPU's own addresses (not a migration target still
    /// staging, nor a source that gave its addresses up): guest work may run only then.
    pub fn at_home(&self) -> bool {
        *self.space.place() == Place::Home
    }

    /// Allocates and maps `size` bytes (not yet zeroed: the caller clears them before
    /// publishing the address); returns the allocation, not yet in the table.
    pub fn create(&self, size: u64) -> Result<Allocation> {
        if size == 0 {
            return Err(BackendError::ZeroSize);
        }
        let sp = &self.space;
        let len = self.checked_len(size)?;
        sp.ledger.charge(len)?;
        let Some(off) = sp.ledger.take_hole(len) else {
            sp.ledger.uncharge(len);
            return Err(BackendError::AddressSpaceFull { requested: size });
        };
        self.back(off, len, size)
    }

    /// Like [`DeviceMemory::create`] at exactly `addr` (a migration target places the
    /// source's allocations where the guest knows them).
    pub fn create_at(&self, addr: u64, size: u64) -> Result<Allocation> {
        if size == 0 {
            return Err(BackendError::ZeroSize);
        }
        let sp = &self.space;
        let base = sp.home.base;
        if addr < base || addr >= base + sp.home.size || (addr - base) % sp.granularity != 0 {
            return Err(BackendError::InvalidArgument(format!(
                "{addr:#x} is not a {:#x}-aligned address of this vGPU's space {base:#x}+{:#x}",
                sp.granularity, sp.home.size
            )));
        }
        let len = self.checked_len(size)?;
        sp.ledger.charge(len)?;
        if !sp.ledger.take_hole_at(addr - base, len) {
            sp.ledger.uncharge(len);
            return Err(BackendError::InvalidArgument(format!(
                "{addr:#x}+{len:#x} overlaps a live allocation or leaves the address space"
            )));
        }
        self.back(addr - base, len, size)
    }

    /// `size` rounded up to the granularity, if it is a size the driver can map.
    fn checked_len(&self, size: u64) -> Result<u64> {
        let sp = &self.space;
        let too_big = || sp.ledger.out_of_memory(size);
        let len = round_up(size, sp.granularity).ok_or_else(too_big)?;
        usize::try_from(len).map_err(|_| too_big())?;
        Ok(len)
    }

    /// Backs the taken (and charged) range `off..off + len` with fresh physical memory.
    fn back(&self, off: u64, len: u64, size: u64) -> Result<Allocation> {
        let sp = &self.space;
        let addr = sp.home.base + off;
        let undo = || {
            sp.ledger.give_hole(off, len);
            sp.ledger.uncharge(len);
        };
        let place = sp.place();
        let Some(va) = sp.va_of(addr, *place) else {
            undo();
            return Err(moving());
        };
        let handle = match create_handle(sp, len) {
            Ok(h) => h,
            Err(e) => {
                undo();
                return Err(e);
            }
        };
        if let Err(e) = sp.map(va, len, handle, *place == Place::Staged) {
            unmap_release(&sp.ctx, None, len, handle);
            undo();
            return Err(dev_err(e));
        }
        drop(place);
        sp.ledger.added();
        Ok(Allocation {
            addr,
            size,
            mapped: len,
            slot: Mutex::new(Slot {
                handle: Some(handle),
                at: Some(va),
            }),
            space: sp.clone(),
            imported: false,
            read_only: false,
            vmm: None,
        })
    }

    /// Puts a created (and cleared) allocation in the table; returns its address.
    pub fn publish(&self, a: Allocation) -> u64 {
        let addr = a.addr;
        tracing::debug!(addr, size = a.size, charged = a.mapped, "allocated");
        self.table.insert(addr, Arc::new(a));
        addr
    }

    /// Bytes an allocation of `size` is charged.
    pub fn charge_of(&self, size: u64) -> u64 {
        round_up(size, self.space.granularity).unwrap_or(u64::MAX)
    }

    /// Removes the allocation starting at `addr` from the table. Its memory is unmapped
    /// when the last user (a running kernel or copy) lets go.
    pub fn free(&self, addr: u64) -> Result<()> {
        if self.table.exact(addr)?.vmm.is_some() {
            // A mapping goes with MEM_UNMAP.
            return Err(BackendError::NotAllocated { addr });
        }
        let a = self.table.remove(addr)?;
        tracing::debug!(addr, size = a.size, "freed");
        Ok(())
    }

    /// The allocation holding all of `[addr, addr + len)`, and the offset of `addr` in it.
    /// A zero-length range must still start inside an allocation.
    pub fn resolve(&self, addr: u64, len: u64) -> Result<(Arc<Allocation>, u64)> {
        self.table.resolve(addr, len)
    }

    /// Like [`DeviceMemory::resolve`] for a write: a read-only mapping is refused.
    pub fn resolve_write(&self, addr: u64, len: u64) -> Result<(Arc<Allocation>, u64)> {
        self.table.resolve_write(addr, len)
    }

    /// Refuses the launch of a kernel with a pointer argument it may write through into a
    /// read-only mapping (before the GPU would fault on it and lose the context). A
    /// pointer inside no allocation passes here: the launch's own checks answer it.
    pub fn check_kernel_writes(&self, args: &[vgpu_proto::ArgValue]) -> Result<()> {
        self.table.check_kernel_writes(args)
    }

    /// The allocation starting at `addr`, checked to be swapped as a whole (`off` 0,
    /// `len` its mapped size).
    fn whole(&self, addr: u64, off: u64, len: u64) -> Result<Arc<Allocation>> {
        let a = self.table.exact(addr)?;
        if a.imported || a.vmm.is_some() {
            return Err(BackendError::NotSupported(
                "shared objects and mapped physical allocations stay resident; only owned allocations are swapped".into(),
            ));
        }
        if off != 0 || len != a.mapped {
            return Err(BackendError::InvalidArgument(format!(
                "the cuda backend swaps whole allocations: {addr:#x} is {} bytes, asked {off:#x}+{len:#x}",
                a.mapped
            )));
        }
        Ok(a)
    }

    /// Releases the physical memory behind the allocation at `addr`, keeping its
    /// addresses reserved (swap-out). The caller has saved its bytes.
    pub fn decommit(&self, addr: u64, off: u64, len: u64) -> Result<()> {
        let a = self.whole(addr, off, len)?;
        let mut slot = lock(&a.slot);
        if let Some(handle) = slot.handle.take() {
            if !unmap_release(&self.space.ctx, slot.at.take(), a.mapped, handle) {
                return Err(BackendError::Device(format!(
                    "unmapping {addr:#x} failed; the allocation is unusable"
                )));
            }
        }
        Ok(())
    }

    /// Maps fresh physical memory at the allocation's addresses again (swap-in).
    pub fn recommit(&self, addr: u64, off: u64, len: u64) -> Result<()> {
        let a = self.whole(addr, off, len)?;
        let mut slot = lock(&a.slot);
        if slot.handle.is_some() {
            return Ok(());
        }
        let sp = &self.space;
        let place = sp.place();
        let va = sp.va_of(addr, *place).ok_or_else(moving)?;
        let handle = create_handle(sp, a.mapped)?;
        if let Err(e) = sp.map(va, a.mapped, handle, *place == Place::Staged) {
            unmap_release(&sp.ctx, None, a.mapped, handle);
            return Err(dev_err(e));
        }
        *slot = Slot {
            handle: Some(handle),
            at: Some(va),
        };
        Ok(())
    }

    /// Migration source at the switch: unmaps every allocation, keeping its memory (the
    /// caller has drained all work). [`DeviceMemory::reoccupy`] maps it back.
    pub fn vacate(&self) -> Result<()> {
        let sp = &self.space;
        let mut place = write(&sp.place);
        if *place != Place::Home {
            return Err(BackendError::InvalidArgument(format!(
                "only memory at its own addresses can be vacated (it is {place:?})"
            )));
        }
        let table = self.table.read();
        let mut done = Vec::new();
        for a in table.values() {
            let mut slot = lock(&a.slot);
            let Some(va) = slot.at else { continue };
            let rc = check(
                // SAFETY: one mapping of ours; every operation on it has finished (the caller
                // drained) and none can start (dispatch is stopped).
                unsafe { sys::cuMemUnmap(va, a.mapped as usize) },
                "cuMemUnmap",
            );
            if let Err(e) = rc {
                drop(slot);
                // Map back what was unmapped: the vGPU stays here, whole.
                for b in done {
                    self.remap_home(&table, b);
                }
                return Err(dev_err(e));
            }
            slot.at = None;
            done.push(a.addr);
        }
        *place = Place::Vacated;
        Ok(())
    }

    /// Maps the allocation at `addr` (unmapped, memory kept) at its own address again.
    fn remap_home(&self, table: &BTreeMap<u64, Arc<Allocation>>, addr: u64) -> Option<CuError> {
        let a = table.get(&addr)?;
        let mut slot = lock(&a.slot);
        let (Some(h), None) = (slot.handle, slot.at) else {
            return None;
        };
        match self.space.map(a.addr, a.mapped, h, false) {
            Ok(()) => {
                slot.at = Some(a.addr);
                None
            }
            Err(e) => {
                tracing::error!(addr, error = %e, "cannot map vGPU memory back at its address");
                Some(e)
            }
        }
    }

    /// Undoes [`DeviceMemory::vacate`] (the switch failed).
    pub fn reoccupy(&self) -> Result<()> {
        let sp = &self.space;
        let mut place = write(&sp.place);
        if *place != Place::Vacated {
            return Ok(());
        }
        sp.home.ordinal.store(sp.ordinal, Ordering::Release);
        let table = self.table.read();
        let mut first = None;
        for addr in table.keys() {
            if let Some(e) = self.remap_home(&table, *addr) {
                first.get_or_insert(e);
            }
        }
        *place = Place::Home;
        first.map_or(Ok(()), |e| Err(dev_err(e)))
    }

    /// Migration target at the switch: moves every allocation from the staging range to
    /// the vGPU's own addresses (the source has vacated them). On failure the allocations
    /// moved so far go back to staging.
    pub fn occupy(&self) -> Result<()> {
        let sp = &self.space;
        let mut place = write(&sp.place);
        if *place != Place::Staged {
            return Ok(());
        }
        let table = self.table.read();
        let mut moved: Vec<&Arc<Allocation>> = Vec::new();
        let mut failed = None;
        for a in table.values() {
            if let Err(e) = self.move_mapping(a, Place::Staged, Place::Home) {
                failed = Some(e);
                break;
            }
            moved.push(a);
        }
        if let Some(e) = failed {
            for a in moved {
                if let Err(e) = self.move_mapping(a, Place::Home, Place::Staged) {
                    tracing::error!(addr = a.addr, error = %e, "cannot move target memory back to staging");
                }
            }
            return Err(BackendError::Device(format!(
                "{e}: the migration target cannot map its memory at the vGPU's addresses"
            )));
        }
        *place = Place::Home;
        sp.home.ordinal.store(sp.ordinal, Ordering::Release);
        Ok(())
    }

    /// Remaps one allocation's memory from its `from` place to its `to` place.
    fn move_mapping(
        &self,
        a: &Allocation,
        from: Place,
        to: Place,
    ) -> std::result::Result<(), CuError> {
        let sp = &self.space;
        let mut slot = lock(&a.slot);
        let (Some(h), Some(at)) = (slot.handle, slot.at) else {
            return Ok(());
        };
        if Some(at) != sp.va_of(a.addr, from) {
            return Ok(());
        }
        let Some(va) = sp.va_of(a.addr, to) else {
            return Ok(());
        };
        check(
            // SAFETY: one mapping of ours, unused (dispatch is stopped; the target ran no
            // guest work yet).
            unsafe { sys::cuMemUnmap(at, a.mapped as usize) },
            "cuMemUnmap",
        )?;
        slot.at = None;
        if let Err(e) = sp.map(va, a.mapped, h, to == Place::Staged) {
            // Put it back where it was, so nothing is lost.
            if sp.map(at, a.mapped, h, from == Place::Staged).is_ok() {
                slot.at = Some(at);
            }
            return Err(e);
        }
        slot.at = Some(va);
        Ok(())
    }

    /// Where `[addr, addr + len)` is mapped now, for a peer's direct copy into it.
    pub fn window(&self, addr: u64, len: u64) -> Option<u64> {
        let (a, off) = self.resolve(addr, len).ok()?;
        a.va().map(|va| va + off)
    }

    /// Drops every allocation (the backend is going away).
    pub fn clear(&self) {
        self.table.clear();
    }
}

/// The error for guest work on memory that is between two GPUs.
pub fn moving() -> BackendError {
    BackendError::Device(
        "this vGPU's memory is being moved to another GPU; retry the request".into(),
    )
}

/// Fresh physical memory of `len` bytes on the space's GPU.
fn create_handle(sp: &Space, len: u64) -> Result<sys::CUmemGenericAllocationHandle> {
    let prop = alloc_prop(sp.ordinal);
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    check(
        // SAFETY: reads `prop`, writes one handle into `handle`.
        unsafe { sys::cuMemCreate(&mut handle, len as usize, &prop, 0) },
        "cuMemCreate",
    )
    .map_err(|e| {
        if e.is_oom() {
            let (free, _) = mem_info().unwrap_or((0, 0));
            tracing::debug!(len, free, "the GPU is out of memory");
            BackendError::OutOfMemory {
                requested: len,
                available: free.min(sp.ledger.capacity().saturating_sub(sp.ledger.used())),
                capacity: sp.ledger.capacity(),
            }
        } else {
            dev_err(e)
        }
    })?;
    Ok(handle)
}

/// A driver error as a backend error.
pub fn dev_err(e: CuError) -> BackendError {
    BackendError::Device(e.to_string())
}
