//! The vGPU's device memory through CUDA's virtual memory management API.
//!
//! The whole vGPU address space `[va_base, va_base + va_size)` is reserved once
//! (`cuMemAddressReserve` at that fixed address, the same range the sim backend uses), and
//! each allocation is physical memory (`cuMemCreate`) mapped at its place in it
//! (`cuMemMap`, `cuMemSetAccess`). A device address therefore depends only on the
//! allocator's choice inside our own range, never on the driver: swapping and migration can
//! later unmap the physical memory and map other memory (another GPU's) at the same
//! addresses. Freed ranges are reused only once nothing uses the allocation any more.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use cudarc::driver::sys;

use super::driver::{check, Context, CuError};
use crate::error::{BackendError, Result};

/// Alignment of every allocation's device address (and of the address space).
pub const VA_ALIGN: u64 = vgpu_proto::DEVICE_ALLOC_ALIGN;

fn round_up(v: u64, align: u64) -> Option<u64> {
    v.checked_add(align - 1).map(|v| v / align * align)
}

/// The reserved address range; freed when the last allocation is gone.
#[derive(Debug)]
struct Reservation {
    base: u64,
    size: u64,
    ctx: Arc<Context>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.ctx.bind().is_err() {
            return;
        }
        if let Err(e) = check(
            // SAFETY: frees the range reserved in `DeviceMemory::new`; every allocation mapped in
            // it holds an Arc of the Space that owns this reservation, so none is mapped now.
            unsafe { sys::cuMemAddressFree(self.base, self.size as usize) },
            "cuMemAddressFree",
        ) {
            tracing::warn!(error = %e, "freeing the vGPU address range failed");
        }
    }
}

/// State shared by the address space and its allocations.
#[derive(Debug)]
struct Space {
    res: Reservation,
    capacity: u64,
    granularity: u64,
    ordinal: i32,
    used: AtomicU64,
    count: AtomicU64,
    /// Free holes: offset -> length, multiples of `granularity`.
    holes: crate::space::Holes,
}

impl Space {
    fn take_hole(&self, len: u64) -> Option<u64> {
        self.holes.take(len)
    }

    fn give_hole(&self, off: u64, len: u64) {
        self.holes.give(off, len)
    }

    fn charge(&self, bytes: u64) -> Result<()> {
        crate::space::charge(&self.used, self.capacity, bytes)
    }

    fn uncharge(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    fn access_desc(&self) -> sys::CUmemAccessDesc {
        sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.ordinal,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        }
    }
}

/// Physical allocation properties: pinned device memory on GPU `ordinal`.
fn alloc_prop(ordinal: i32) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// The allocation granularity of GPU `ordinal` for our properties, at least `VA_ALIGN`.
pub fn granularity(ordinal: i32) -> std::result::Result<u64, CuError> {
    let prop = alloc_prop(ordinal);
    let mut g: usize = 0;
    check(
        // SAFETY: reads `prop` (a valid struct on this frame), writes one usize into `g`.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        },
        "cuMemGetAllocationGranularity",
    )?;
    let g = (g as u64).max(1);
    // Every allocation must start 2 MiB aligned (protocol): use a common multiple.
    Ok(if VA_ALIGN % g == 0 {
        VA_ALIGN
    } else {
        round_up(g, VA_ALIGN).unwrap_or(VA_ALIGN)
    })
}

/// One live allocation: physical memory mapped at its place in the reserved range.
#[derive(Debug)]
pub struct Allocation {
    addr: u64,
    size: u64,
    mapped: u64,
    /// The physical memory mapped at `addr`; None while swapped out (decommitted).
    handle: std::sync::Mutex<Option<sys::CUmemGenericAllocationHandle>>,
    space: Arc<Space>,
}

impl Allocation {
    /// Its device address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
}

/// Unmaps `[addr, addr + len)` and releases `handle`; false if the unmap failed (the range
/// must then never be handed out again).
fn unmap_release(
    ctx: &Context,
    addr: u64,
    len: u64,
    handle: sys::CUmemGenericAllocationHandle,
    mapped: bool,
) -> bool {
    if let Err(e) = ctx.bind() {
        tracing::error!(error = %e, "cannot bind the CUDA context to free device memory");
        return false;
    }
    let mut ok = true;
    if mapped {
        if let Err(e) = check(
            // SAFETY: [addr, addr + len) is exactly one mapping we made with cuMemMap, and
            // nothing uses it any more (every user held the Arc that is being dropped).
            unsafe { sys::cuMemUnmap(addr, len as usize) },
            "cuMemUnmap",
        ) {
            tracing::error!(addr, error = %e, "unmapping device memory failed; its address range is retired");
            ok = false;
        }
    }
    // SAFETY: releases our own handle from cuMemCreate, once; the physical memory goes away
    // when no mapping uses it.
    if let Err(e) = check(unsafe { sys::cuMemRelease(handle) }, "cuMemRelease") {
        tracing::error!(addr, error = %e, "releasing device memory failed");
    }
    ok
}

impl Drop for Allocation {
    fn drop(&mut self) {
        let handle = self
            .handle
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let reusable = match handle {
            Some(h) => unmap_release(&self.space.res.ctx, self.addr, self.mapped, h, true),
            None => true,
        };
        if reusable {
            self.space
                .give_hole(self.addr - self.space.res.base, self.mapped);
        }
        self.space.uncharge(self.mapped);
        self.space.count.fetch_sub(1, Ordering::AcqRel);
        tracing::trace!(addr = self.addr, size = self.size, "device memory released");
    }
}

/// A vGPU's device address space and its allocation table.
#[derive(Debug)]
pub struct DeviceMemory {
    space: Arc<Space>,
    table: RwLock<BTreeMap<u64, Arc<Allocation>>>,
}

impl DeviceMemory {
    /// Reserves `[va_base, va_base + va_size)` in `ctx` (bound by the caller) for at most
    /// `capacity` bytes of GPU `ordinal`'s memory.
    pub fn new(
        ctx: &Arc<Context>,
        ordinal: i32,
        va_base: u64,
        va_size: u64,
        capacity: u64,
    ) -> Result<Self> {
        if va_base % VA_ALIGN != 0 || va_base == 0 || va_size < VA_ALIGN || va_size % VA_ALIGN != 0
        {
            return Err(BackendError::InvalidArgument(format!(
                "device address space {va_base:#x}+{va_size:#x} must be non-null and 2 MiB aligned"
            )));
        }
        va_base.checked_add(va_size).ok_or_else(|| {
            BackendError::InvalidArgument(format!(
                "device address space {va_base:#x}+{va_size:#x} overflows"
            ))
        })?;
        let granularity = granularity(ordinal).map_err(dev_err)?;
        let mut got: sys::CUdeviceptr = 0;
        check(
            // SAFETY: writes one device address into `got`; reserves address space only.
            unsafe { sys::cuMemAddressReserve(&mut got, va_size as usize, VA_ALIGN as usize, va_base, 0) },
            "cuMemAddressReserve",
        )
        .map_err(|e| {
            BackendError::Device(format!(
                "{e}: cannot reserve the vGPU address space {va_base:#x}+{va_size:#x}; pick a smaller or another range"
            ))
        })?;
        let res = Reservation {
            base: got,
            size: va_size,
            ctx: ctx.clone(),
        };
        if got != va_base {
            drop(res);
            return Err(BackendError::Device(format!(
                "the driver placed the vGPU address space at {got:#x} instead of {va_base:#x} (the range is \
                 taken in this process); pick another va_base"
            )));
        }
        tracing::debug!(
            va_base = format_args!("{va_base:#x}"),
            va_size,
            granularity,
            "vGPU address space reserved"
        );
        Ok(Self {
            space: Arc::new(Space {
                res,
                capacity,
                granularity,
                ordinal,
                used: AtomicU64::new(0),
                count: AtomicU64::new(0),
                holes: crate::space::Holes::new(va_size / granularity * granularity),
            }),
            table: RwLock::new(BTreeMap::new()),
        })
    }

    /// Allocation granularity (sizes are charged rounded up to it).
    pub fn granularity(&self) -> u64 {
        self.space.granularity
    }

    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.space.used.load(Ordering::Acquire)
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.space.capacity
    }

    /// Live allocations (including freed ones still used by running work).
    pub fn count(&self) -> u64 {
        self.space.count.load(Ordering::Acquire)
    }

    /// Allocates and maps `size` bytes (not yet zeroed: the caller clears them before
    /// publishing the address); returns the allocation, not yet in the table.
    pub fn create(&self, size: u64) -> Result<Allocation> {
        if size == 0 {
            return Err(BackendError::ZeroSize);
        }
        let sp = &self.space;
        let too_big = || BackendError::OutOfMemory {
            requested: size,
            available: sp.capacity.saturating_sub(self.used()),
            capacity: sp.capacity,
        };
        let len = round_up(size, sp.granularity).ok_or_else(too_big)?;
        let len_us = usize::try_from(len).map_err(|_| too_big())?;
        sp.charge(len)?;
        let Some(off) = sp.take_hole(len) else {
            sp.uncharge(len);
            return Err(BackendError::AddressSpaceFull { requested: size });
        };
        let addr = sp.res.base + off;
        let undo = |handle: Option<(sys::CUmemGenericAllocationHandle, bool)>| {
            let reusable = match handle {
                Some((h, mapped)) => unmap_release(&sp.res.ctx, addr, len, h, mapped),
                None => true,
            };
            if reusable {
                sp.give_hole(off, len);
            }
            sp.uncharge(len);
        };
        let prop = alloc_prop(sp.ordinal);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        if let Err(e) = check(
            // SAFETY: reads `prop`, writes one handle into `handle`.
            unsafe { sys::cuMemCreate(&mut handle, len_us, &prop, 0) },
            "cuMemCreate",
        ) {
            undo(None);
            return Err(if e.is_oom() {
                let (free, _) = mem_info().unwrap_or((0, 0));
                tracing::debug!(size, free, "the GPU is out of memory");
                BackendError::OutOfMemory {
                    requested: len,
                    available: free.min(sp.capacity.saturating_sub(self.used())),
                    capacity: sp.capacity,
                }
            } else {
                dev_err(e)
            });
        }
        if let Err(e) = check(
            // SAFETY: maps our fresh handle over [addr, addr + len), a hole of our own reserved
            // range that no other allocation uses.
            unsafe { sys::cuMemMap(addr, len_us, 0, handle, 0) },
            "cuMemMap",
        ) {
            undo(Some((handle, false)));
            return Err(dev_err(e));
        }
        let desc = sp.access_desc();
        if let Err(e) = check(
            // SAFETY: sets access on the mapping just made; reads one descriptor.
            unsafe { sys::cuMemSetAccess(addr, len_us, &desc, 1) },
            "cuMemSetAccess",
        ) {
            undo(Some((handle, true)));
            return Err(dev_err(e));
        }
        sp.count.fetch_add(1, Ordering::AcqRel);
        Ok(Allocation {
            addr,
            size,
            mapped: len,
            handle: std::sync::Mutex::new(Some(handle)),
            space: sp.clone(),
        })
    }

    /// Puts a created (and cleared) allocation in the table; returns its address.
    pub fn publish(&self, a: Allocation) -> u64 {
        let addr = a.addr;
        tracing::debug!(addr, size = a.size, charged = a.mapped, "allocated");
        self.table
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(addr, Arc::new(a));
        addr
    }

    /// Bytes an allocation of `size` is charged.
    pub fn charge_of(&self, size: u64) -> u64 {
        round_up(size, self.space.granularity).unwrap_or(u64::MAX)
    }

    /// Removes the allocation starting at `addr` from the table. Its memory is unmapped
    /// when the last user (a running kernel or copy) lets go.
    pub fn free(&self, addr: u64) -> Result<()> {
        let removed = self
            .table
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&addr);
        match removed {
            Some(a) => {
                tracing::debug!(addr, size = a.size, "freed");
                Ok(())
            }
            None => Err(BackendError::NotAllocated { addr }),
        }
    }

    /// The allocation holding all of `[addr, addr + len)`, and the offset of `addr` in it.
    /// A zero-length range must still start inside an allocation.
    pub fn resolve(&self, addr: u64, len: u64) -> Result<(Arc<Allocation>, u64)> {
        let bad = BackendError::BadPointer { addr, len };
        let table = self.table.read().unwrap_or_else(PoisonError::into_inner);
        let (_, a) = table.range(..=addr).next_back().ok_or(bad)?;
        let off = addr - a.addr;
        let end = off
            .checked_add(len)
            .ok_or(BackendError::BadPointer { addr, len })?;
        if off >= a.size || end > a.size {
            return Err(BackendError::BadPointer { addr, len });
        }
        Ok((a.clone(), off))
    }

    /// The allocation starting at `addr`, checked to be swapped as a whole (`off` 0,
    /// `len` its mapped size).
    fn whole(&self, addr: u64, off: u64, len: u64) -> Result<Arc<Allocation>> {
        let a = self
            .table
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&addr)
            .cloned()
            .ok_or(BackendError::NotAllocated { addr })?;
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
        let mut h = a.handle.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(handle) = h.take() {
            if !unmap_release(&self.space.res.ctx, addr, a.mapped, handle, true) {
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
        let mut h = a.handle.lock().unwrap_or_else(PoisonError::into_inner);
        if h.is_some() {
            return Ok(());
        }
        let sp = &self.space;
        let len_us = usize::try_from(a.mapped)
            .map_err(|_| BackendError::InvalidArgument("allocation too large".into()))?;
        let prop = alloc_prop(sp.ordinal);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        check(
            // SAFETY: reads `prop`, writes one handle into `handle`.
            unsafe { sys::cuMemCreate(&mut handle, len_us, &prop, 0) },
            "cuMemCreate",
        )
        .map_err(|e| {
            if e.is_oom() {
                BackendError::OutOfMemory {
                    requested: a.mapped,
                    available: mem_info().map(|(f, _)| f).unwrap_or(0),
                    capacity: sp.capacity,
                }
            } else {
                dev_err(e)
            }
        })?;
        if let Err(e) = check(
            // SAFETY: maps our fresh handle over the allocation's own range, unmapped since
            // its decommit (we hold its handle lock).
            unsafe { sys::cuMemMap(addr, len_us, 0, handle, 0) },
            "cuMemMap",
        ) {
            unmap_release(&sp.res.ctx, addr, a.mapped, handle, false);
            return Err(dev_err(e));
        }
        let desc = sp.access_desc();
        if let Err(e) = check(
            // SAFETY: sets access on the mapping just made; reads one descriptor.
            unsafe { sys::cuMemSetAccess(addr, len_us, &desc, 1) },
            "cuMemSetAccess",
        ) {
            unmap_release(&sp.res.ctx, addr, a.mapped, handle, true);
            return Err(dev_err(e));
        }
        *h = Some(handle);
        Ok(())
    }

    /// Drops every allocation (the backend is going away).
    pub fn clear(&self) {
        let all = std::mem::take(&mut *self.table.write().unwrap_or_else(PoisonError::into_inner));
        drop(all);
    }
}

/// Free and total memory of the current context's device.
pub fn mem_info() -> std::result::Result<(u64, u64), CuError> {
    let (mut free, mut total) = (0usize, 0usize);
    check(
        // SAFETY: writes two usizes.
        unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) },
        "cuMemGetInfo",
    )?;
    Ok((free as u64, total as u64))
}

/// A driver error as a backend error.
pub fn dev_err(e: CuError) -> BackendError {
    BackendError::Device(e.to_string())
}
