//! The virtual memory management API on a real GPU: a physical allocation is a driver
//! handle from `cuMemCreate` (charged to the vGPU's ledger until the handle is released),
//! a mapping maps it (`cuMemMap`, read-write access for our GPU) at its place in the
//! vGPU's own reserved range, which this backend already holds whole, and is an entry of
//! the allocation table like any allocation. The entry holds a reference of its own to
//! the handle (`cuMemRetainAllocationHandle`), which its drop unmaps and releases, so the
//! memory lives while a handle reference or a mapping does, as with the driver.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;

use super::super::driver::check;
use super::{create_handle, dev_err, moving, unmap_release, Allocation, DeviceMemory, Place};
use super::{Slot, Space};
use crate::error::{BackendError, Result};
use crate::virt::{MapGuard, Physical, Vmm, VmmHost, GRANULARITY};

/// A physical allocation: a driver handle on our GPU.
#[derive(Debug)]
pub(crate) struct CudaPhys {
    handle: sys::CUmemGenericAllocationHandle,
    size: u64,
    /// Cleared once, where it is first mapped (physical memory may hold an earlier user's
    /// bytes; the protocol promises zeroes).
    zeroed: AtomicBool,
    space: Arc<Space>,
}

impl Physical for CudaPhys {
    fn size(&self) -> u64 {
        self.size
    }

    fn charged(&self) -> u64 {
        self.size
    }
}

impl Drop for CudaPhys {
    fn drop(&mut self) {
        // No mapping is left (each holds this object); the handle goes with its last
        // reference.
        unmap_release(&self.space.ctx, None, self.size, self.handle);
        self.space.ledger.uncharge(self.size);
        tracing::trace!(size = self.size, "physical allocation released");
    }
}

impl DeviceMemory {
    /// The virtual memory book-keeping of this address space.
    pub(crate) fn vmm(&self) -> &Vmm<CudaPhys> {
        &self.vmm
    }

    /// Whether the virtual memory API can run here: the GPU maps in pieces of the
    /// protocol's granularity.
    pub(crate) fn vmm_usable(&self) -> bool {
        self.space.granularity == GRANULARITY
    }
}

impl VmmHost for DeviceMemory {
    type Phys = CudaPhys;

    fn space(&self) -> (u64, u64) {
        (self.space.home.base, self.space.home.size)
    }

    fn take_hole_at(&self, off: u64, len: u64) -> bool {
        self.space.ledger.take_hole_at(off, len)
    }

    fn take_hole_aligned(&self, len: u64, align: u64) -> Option<u64> {
        self.space
            .ledger
            .take_hole_aligned(self.space.home.base, len, align)
    }

    fn give_hole_later(&self, off: u64, len: u64) -> Box<dyn FnOnce() + Send> {
        let space = self.space.clone();
        Box::new(move || space.ledger.give_hole(off, len))
    }

    fn create_phys(&self, size: u64) -> Result<CudaPhys> {
        let sp = &self.space;
        usize::try_from(size).map_err(|_| sp.ledger.out_of_memory(size))?;
        sp.ledger.charge(size)?;
        match create_handle(sp, size) {
            Ok(handle) => Ok(CudaPhys {
                handle,
                size,
                zeroed: AtomicBool::new(false),
                space: sp.clone(),
            }),
            Err(e) => {
                sp.ledger.uncharge(size);
                Err(e)
            }
        }
    }

    fn place(&self, addr: u64, len: u64, phys: &Arc<CudaPhys>, guard: MapGuard) -> Result<()> {
        let sp = &self.space;
        let place = sp.place();
        // At the vGPU's own address; on a migration target still staging, at the staging
        // range's (the switch moves it home with every allocation).
        let Some(va) = sp.va_of(addr, *place) else {
            return Err(moving());
        };
        let staged = *place == Place::Staged;
        sp.map(va, len, phys.handle, staged).map_err(dev_err)?;
        let undo = |e| {
            // SAFETY: undoes the mapping just made; nothing can have used it.
            let _ = unsafe { sys::cuMemUnmap(va, len as usize) };
            dev_err(e)
        };
        if !phys.zeroed.swap(true, Ordering::AcqRel) {
            let cleared = check(
                // SAFETY: clears exactly the mapping just made, which nothing else uses yet.
                unsafe { sys::cuMemsetD8_v2(va, 0, len as usize) },
                "cuMemsetD8",
            )
            .and_then(|()| {
                check(
                    // SAFETY: waits for the legacy stream's memset above.
                    unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) },
                    "cuStreamSynchronize",
                )
            });
            if let Err(e) = cleared {
                phys.zeroed.store(false, Ordering::Release);
                return Err(undo(e));
            }
        }
        // The entry's own reference: its drop unmaps and releases it.
        let mut own: sys::CUmemGenericAllocationHandle = 0;
        if let Err(e) = check(
            // SAFETY: `va` starts the mapping just made; writes one handle into `own`.
            unsafe { sys::cuMemRetainAllocationHandle(&mut own, va as *mut c_void) },
            "cuMemRetainAllocationHandle",
        ) {
            return Err(undo(e));
        }
        drop(place);
        sp.ledger.added();
        self.table.insert(
            addr,
            Arc::new(Allocation {
                addr,
                size: len,
                mapped: len,
                slot: Mutex::new(Slot {
                    handle: Some(own),
                    at: Some(va),
                }),
                space: sp.clone(),
                imported: false,
                read_only: false,
                vmm: Some(guard),
            }),
        );
        Ok(())
    }

    fn remove(&self, addr: u64) -> Result<()> {
        if self.table.exact(addr)?.vmm.is_none() {
            return Err(BackendError::NotAllocated { addr });
        }
        self.table.remove(addr).map(drop)
    }
}
