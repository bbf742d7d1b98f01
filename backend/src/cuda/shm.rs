//! Shared device memory on a real GPU: exportable physical allocations.
//!
//! A shared object is physical memory made with `cuMemCreate` asking for a POSIX file
//! descriptor handle, exported with `cuMemExportToShareableHandle`. The descriptor is the
//! object (vgpud keeps it in its registry as it keeps the sim's memfd): the memory lives
//! while any descriptor, imported handle or mapping of it does. A mapper imports the
//! descriptor (`cuMemImportFromShareableHandle`), maps it in its own vGPU range and grants
//! its own device read-write, or read-only for a read-only attach.

use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;

use super::super::driver::{check, CuError};
use super::super::vmm::{alloc_prop, granularity};
use super::{moving, round_up, unmap_release, Allocation, DeviceMemory, Place, Slot, VA_ALIGN};
use crate::error::{BackendError, Result};

impl DeviceMemory {
    /// Maps a shared object (its exported descriptor `fd`, `size` bytes) at a fresh address
    /// of the vGPU's range, read-only for our GPU when `read_only`; nothing is charged to
    /// this address space. [`DeviceMemory::free`] unmaps it and releases the import.
    pub fn import(&self, fd: OwnedFd, size: u64, read_only: bool) -> Result<u64> {
        if size == 0 {
            return Err(BackendError::ZeroSize);
        }
        let sp = &self.space;
        let len = self.checked_len(size)?;
        let place = sp.place();
        if *place != Place::Home {
            return Err(moving());
        }
        let off = sp
            .ledger
            .take_hole(len)
            .ok_or(BackendError::AddressSpaceFull { requested: size })?;
        let addr = sp.home.base + off;
        let mapped = import(&fd).and_then(|handle| {
            map(addr, len, handle, sp.ordinal, read_only)
                .inspect_err(|_| {
                    unmap_release(&sp.ctx, None, len, handle);
                })
                .map(|()| handle)
        });
        drop(fd);
        let handle = match mapped {
            Ok(h) => h,
            Err(e) => {
                sp.ledger.give_hole(off, len);
                return Err(BackendError::Device(format!(
                    "{e}: cannot map the shared object of {size} bytes"
                )));
            }
        };
        drop(place);
        sp.ledger.added();
        self.table.insert(
            addr,
            Arc::new(Allocation {
                addr,
                size,
                mapped: len,
                slot: Mutex::new(Slot {
                    handle: Some(handle),
                    at: Some(addr),
                }),
                space: sp.clone(),
                imported: true,
                read_only,
                vmm: None,
            }),
        );
        tracing::debug!(addr, size, read_only, "shared object mapped");
        Ok(addr)
    }

    /// Creates a zeroed, exported shared object of `size` bytes on our GPU.
    pub fn export(&self, size: u64) -> Result<OwnedFd> {
        if size == 0 {
            return Err(BackendError::ZeroSize);
        }
        self.checked_len(size)?;
        export(self.space.ordinal, size).map_err(|e| {
            BackendError::Device(format!(
                "{e}: cannot create a shared object of {size} bytes"
            ))
        })
    }
}

const POSIX_FD: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// Bytes of physical memory behind an object of `size` bytes on GPU `ordinal`: `size`
/// rounded up to the allocation granularity (every mapper maps exactly this much).
fn object_len(ordinal: i32, size: u64) -> std::result::Result<u64, CuError> {
    let g = granularity(ordinal)?;
    round_up(size, g).ok_or(CuError {
        code: sys::CUresult::CUDA_ERROR_INVALID_VALUE,
        call: "shared object size",
    })
}

/// Creates a zeroed shared object of `size` bytes on GPU `ordinal` and exports it as a
/// file descriptor. The caller's context (of that GPU) is bound.
fn export(ordinal: i32, size: u64) -> std::result::Result<OwnedFd, CuError> {
    let len = object_len(ordinal, size)?;
    let mut prop = alloc_prop(ordinal);
    prop.requestedHandleTypes = POSIX_FD;
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    check(
        // SAFETY: reads `prop` (on this frame), writes one handle into `handle`.
        unsafe { sys::cuMemCreate(&mut handle, len as usize, &prop, 0) },
        "cuMemCreate",
    )?;
    let out = zero(ordinal, handle, len).and_then(|()| {
        let mut fd: i32 = -1;
        check(
            // SAFETY: for a POSIX descriptor handle the driver writes one int (the new
            // descriptor) through the pointer; `handle` is ours and live.
            unsafe {
                sys::cuMemExportToShareableHandle(
                    (&mut fd as *mut i32).cast::<c_void>(),
                    handle,
                    POSIX_FD,
                    0,
                )
            },
            "cuMemExportToShareableHandle",
        )?;
        // SAFETY: the driver just opened `fd` for us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    });
    // The descriptor keeps the memory alive; our handle is no longer needed.
    // SAFETY: releases our own handle from cuMemCreate, once.
    if let Err(e) = check(unsafe { sys::cuMemRelease(handle) }, "cuMemRelease") {
        tracing::warn!(error = %e, "releasing an exported handle failed");
    }
    out
}

/// Clears `len` bytes of `handle` through a temporary mapping: fresh physical memory may
/// hold an earlier tenant's bytes.
fn zero(
    ordinal: i32,
    handle: sys::CUmemGenericAllocationHandle,
    len: u64,
) -> std::result::Result<(), CuError> {
    let mut va: sys::CUdeviceptr = 0;
    check(
        // SAFETY: writes one device address into `va`; reserves address space only.
        unsafe { sys::cuMemAddressReserve(&mut va, len as usize, VA_ALIGN as usize, 0, 0) },
        "cuMemAddressReserve",
    )?;
    let r = map(va, len, handle, ordinal, false).and_then(|()| {
        let cleared = check(
            // SAFETY: [va, va + len) is the read-write mapping just made.
            unsafe { sys::cuMemsetD8_v2(va, 0, len as usize) },
            "cuMemsetD8",
        )
        .and_then(|()| {
            // SAFETY: waits for the memset in the bound context.
            check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
        });
        // SAFETY: undoes the mapping made above; the memset has finished (or failed).
        let _ = unsafe { sys::cuMemUnmap(va, len as usize) };
        cleared
    });
    // SAFETY: frees the range reserved above; nothing is mapped in it any more.
    let _ = unsafe { sys::cuMemAddressFree(va, len as usize) };
    r
}

/// Imports an exported object's descriptor as an allocation handle of this process. The
/// caller releases it (`cuMemRelease`) when its mapping is gone; `fd` may close now.
fn import(fd: &OwnedFd) -> std::result::Result<sys::CUmemGenericAllocationHandle, CuError> {
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // For a POSIX descriptor the driver takes the descriptor's value in the pointer.
    let os_handle = fd.as_raw_fd() as usize as *mut c_void;
    check(
        // SAFETY: `fd` is open for the whole call; the driver duplicates what it keeps and
        // writes one handle into `handle`.
        unsafe { sys::cuMemImportFromShareableHandle(&mut handle, os_handle, POSIX_FD) },
        "cuMemImportFromShareableHandle",
    )?;
    Ok(handle)
}

/// Maps `handle` over `[va, va + len)` (a free range of ours) with access for GPU
/// `ordinal` only: read-only when `read_only`.
fn map(
    va: u64,
    len: u64,
    handle: sys::CUmemGenericAllocationHandle,
    ordinal: i32,
    read_only: bool,
) -> std::result::Result<(), CuError> {
    let len_us = len as usize;
    check(
        // SAFETY: maps a live handle over a range of one of our reservations that the
        // caller owns and that nothing else maps.
        unsafe { sys::cuMemMap(va, len_us, 0, handle, 0) },
        "cuMemMap",
    )?;
    let desc = sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal,
        },
        flags: if read_only {
            sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ
        } else {
            sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        },
    };
    let rc = check(
        // SAFETY: sets access on the mapping just made; reads one descriptor.
        unsafe { sys::cuMemSetAccess(va, len_us, &desc, 1) },
        "cuMemSetAccess",
    );
    if let Err(e) = rc {
        // SAFETY: undoes the mapping just made; nothing can have used it.
        let _ = unsafe { sys::cuMemUnmap(va, len_us) };
        return Err(e);
    }
    Ok(())
}
