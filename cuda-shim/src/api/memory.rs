//! Device memory, host memory from the DMA pool (page-locked: copies from and to it are
//! zero-copy), registered host memory (copies bounce), pointer attributes.

use std::ffi::{c_int, c_uint, c_void};

use guest_driver::Transport;

use crate::driver::{self, Alloc, Driver, HostAlloc, Res};
use crate::types::{
    ptr_attr, res, CUcontext, CUdeviceptr, CUresult, CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST,
};
use crate::{guard, out};

/// Host allocations are page aligned.
const HOST_ALIGN: usize = 4096;

/// Frees every device allocation made in context `ctx` (its work has completed).
pub(crate) fn free_context_allocations(d: &mut Driver, ctx: u64) {
    let t = d.t.clone();
    let mine: Vec<u64> = d
        .allocs
        .iter()
        .filter(|(_, a)| a.ctx == ctx && !a.vmm)
        .map(|(&p, _)| p)
        .collect();
    for p in mine {
        d.allocs.remove(&p);
        if let Ok(mut q) = d.queue(0) {
            if let Err(e) = q.call(&t, |s| s.free(p)) {
                tracing::warn!(
                    addr = format_args!("{p:#x}"),
                    code = e,
                    "freeing a context's allocation failed"
                );
            }
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    guard("cuMemAlloc_v2", || {
        let p = driver::with(|d| {
            let ctx = d.current_ctx()?;
            if dptr.is_null() || size == 0 {
                return Err(res::INVALID_VALUE);
            }
            let t = d.t.clone();
            let p = d.queue(0)?.call(&t, |s| s.alloc(size as u64))?;
            let id = d.handle();
            d.allocs.insert(
                p,
                Alloc {
                    size: size as u64,
                    ctx,
                    id,
                    module: 0,
                    vmm: false,
                },
            );
            Ok(p)
        })?;
        // SAFETY: checked non-null; a writable CUdeviceptr from the caller.
        unsafe { out(dptr, p) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    guard("cuMemFree_v2", || {
        driver::with(|d| {
            d.current_ctx()?;
            if dptr == 0 {
                return Ok(());
            }
            // A module variable is the module's memory, a mapping goes with cuMemUnmap:
            // neither is an allocation.
            if d.allocs.get(&dptr).is_none_or(|a| a.module != 0 || a.vmm) {
                return Err(res::INVALID_VALUE);
            }
            // Freeing synchronises: work still using the allocation completes first.
            let t = d.t.clone();
            d.drain_all();
            d.allocs.remove(&dptr);
            d.queue(0)?.call(&t, |s| s.free(dptr))
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    guard("cuMemGetInfo_v2", || {
        let info = driver::with(|d| {
            d.current_ctx()?;
            let t = d.t.clone();
            d.queue(0)?.call(&t, |s| s.get_info())
        })?;
        let avail = info.memory_share.saturating_sub(info.memory_used);
        if free.is_null() || total.is_null() {
            return Err(res::INVALID_VALUE);
        }
        // SAFETY: both checked non-null; writable size_t from the caller.
        unsafe {
            out(free, avail as usize)?;
            out(total, info.memory_share as usize)
        }
    })
}

fn host_alloc(pp: *mut *mut c_void, size: usize, flags: c_uint) -> Res<()> {
    let p = driver::with(|d| {
        d.current_ctx()?;
        if pp.is_null() || size == 0 {
            return Err(res::INVALID_VALUE);
        }
        let region =
            d.t.dma_alloc(size, HOST_ALIGN)
                .map_err(|_| res::OUT_OF_MEMORY)?;
        let p = region.virt().as_ptr() as usize;
        // The pool may have grown a region: the GPU reaches it too where it can.
        if !d.device_mapped(p as u64, size as u64) {
            d.map_pool();
        }
        let id = d.handle();
        d.host.insert(
            p,
            HostAlloc {
                region,
                size,
                flags,
                id,
            },
        );
        Ok(p)
    })?;
    // SAFETY: checked non-null; a writable `void*` from the caller.
    unsafe { out(pp, p as *mut c_void) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult {
    guard("cuMemAllocHost_v2", || host_alloc(pp, size, 0))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> CUresult {
    guard("cuMemHostAlloc", || host_alloc(pp, size, flags))
}

#[no_mangle]
pub extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    guard("cuMemFreeHost", || {
        driver::with(|d| {
            let key = p as usize;
            if !d.host.contains_key(&key) {
                return Err(res::INVALID_VALUE);
            }
            let t = d.t.clone();
            d.drain_all();
            if let Some(h) = d.host.remove(&key) {
                // SAFETY: every queue is idle: no request uses the memory any more.
                unsafe { t.dma_free(h.region) };
            }
            Ok(())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: *mut c_uint, p: *mut c_void) -> CUresult {
    guard("cuMemHostGetFlags", || {
        let f = driver::with(|d| {
            d.host_of(p as usize)
                .map(|(_, h)| h.flags)
                .ok_or(res::INVALID_VALUE)
        })?;
        // SAFETY: a writable unsigned int from the caller.
        unsafe { out(flags, f) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, size: usize, _flags: c_uint) -> CUresult {
    guard("cuMemHostRegister_v2", || {
        driver::with(|d| {
            d.current_ctx()?;
            let base = p as usize;
            if p.is_null() || size == 0 {
                return Err(res::INVALID_VALUE);
            }
            let end = base.checked_add(size).ok_or(res::INVALID_VALUE)?;
            let overlaps = d
                .registered
                .range(..end)
                .next_back()
                .is_some_and(|(&b, &s)| b + s > base);
            if overlaps || d.host_of(base).is_some() {
                return Err(res::HOST_MEMORY_ALREADY_REGISTERED);
            }
            d.registered.insert(base, size);
            Ok(())
        })
    })
}

#[no_mangle]
pub extern "C" fn cuMemHostRegister(p: *mut c_void, size: usize, flags: c_uint) -> CUresult {
    cuMemHostRegister_v2(p, size, flags)
}

#[no_mangle]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    guard("cuMemHostUnregister", || {
        driver::with(|d| {
            d.current_ctx()?;
            if p.is_null() {
                return Err(res::INVALID_VALUE);
            }
            d.registered
                .remove(&(p as usize))
                .map(drop)
                .ok_or(res::HOST_MEMORY_NOT_REGISTERED)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    pdptr: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    guard("cuMemHostGetDevicePointer_v2", || {
        driver::with(|d| {
            d.current_ctx()?;
            if pdptr.is_null() || flags != 0 {
                return Err(res::INVALID_VALUE);
            }
            if d.host_of(p as usize).is_some() && d.device_mapped(p as u64, 1) {
                // Pool memory the GPU reaches at its host address (unified addressing):
                // the device pointer is the pointer itself.
                // SAFETY: checked non-null; a writable CUdeviceptr from the caller.
                return unsafe { out(pdptr, p as CUdeviceptr) };
            }
            let ours = d.host_of(p as usize).is_some() || d.registered_of(p as usize).is_some();
            if !ours {
                return Err(res::INVALID_VALUE);
            }
            // Registered memory, and pool memory on a vGPU whose worker cannot map it,
            // has no device address: kernels reach device memory only.
            crate::api::stubs::log_once("cuMemHostGetDevicePointer (mapped host memory)");
            Err(res::NOT_SUPPORTED)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    pbase: *mut CUdeviceptr,
    psize: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    guard("cuMemGetAddressRange_v2", || {
        let (base, size) = driver::with(|d| {
            d.current_ctx()?;
            d.alloc_of(dptr)
                .map(|(b, a)| (b, a.size))
                .ok_or(res::NOT_FOUND)
        })?;
        if !pbase.is_null() {
            // SAFETY: non-null, writable from the caller.
            unsafe { out(pbase, base)? };
        }
        if !psize.is_null() {
            // SAFETY: non-null, writable from the caller.
            unsafe { out(psize, size as usize)? };
        }
        Ok(())
    })
}

/// What a pointer is, for `cuPointerGetAttribute`.
enum Owner {
    Device {
        base: u64,
        size: u64,
        ctx: u64,
        id: u64,
    },
    Host {
        base: usize,
        size: usize,
        id: u64,
        /// The GPU reaches it at its host address.
        mapped: bool,
    },
}

fn owner(d: &Driver, ptr: u64) -> Res<Owner> {
    if let Some((base, a)) = d.alloc_of(ptr) {
        return Ok(Owner::Device {
            base,
            size: a.size,
            ctx: a.ctx,
            id: a.id,
        });
    }
    if let Some((base, h)) = d.host_of(ptr as usize) {
        return Ok(Owner::Host {
            base,
            size: h.size,
            id: h.id,
            mapped: d.device_mapped(base as u64, h.size as u64),
        });
    }
    if let Some((base, size)) = d.registered_of(ptr as usize) {
        return Ok(Owner::Host {
            base,
            size,
            id: base as u64,
            mapped: false,
        });
    }
    Err(res::INVALID_VALUE)
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: c_int,
    ptr: CUdeviceptr,
) -> CUresult {
    guard("cuPointerGetAttribute", || {
        let (o, primary) = driver::with(|d| Ok((owner(d, ptr)?, d.primary)))?;
        if data.is_null() {
            return Err(res::INVALID_VALUE);
        }
        // SAFETY: `data` is non-null and, by the API's contract, points to storage of the
        // attribute's type, which is what each arm writes.
        unsafe {
            match (attribute, o) {
                (ptr_attr::CONTEXT, Owner::Device { ctx, .. }) => {
                    out(data.cast::<CUcontext>(), ctx as CUcontext)
                }
                (ptr_attr::CONTEXT, Owner::Host { .. }) => {
                    out(data.cast::<CUcontext>(), primary as CUcontext)
                }
                (ptr_attr::MEMORY_TYPE, Owner::Device { .. }) => {
                    out(data.cast::<c_uint>(), CU_MEMORYTYPE_DEVICE)
                }
                (ptr_attr::MEMORY_TYPE, Owner::Host { .. }) => {
                    out(data.cast::<c_uint>(), CU_MEMORYTYPE_HOST)
                }
                (ptr_attr::DEVICE_POINTER, Owner::Device { .. })
                | (ptr_attr::DEVICE_POINTER, Owner::Host { mapped: true, .. }) => {
                    out(data.cast::<CUdeviceptr>(), ptr)
                }
                (ptr_attr::HOST_POINTER, Owner::Host { .. }) => {
                    out(data.cast::<*mut c_void>(), ptr as *mut c_void)
                }
                (ptr_attr::DEVICE_POINTER | ptr_attr::HOST_POINTER, _) => Err(res::INVALID_VALUE),
                (ptr_attr::BUFFER_ID, Owner::Device { id, .. } | Owner::Host { id, .. }) => {
                    out(data.cast::<u64>(), id)
                }
                (ptr_attr::IS_MANAGED, _) => out(data.cast::<c_uint>(), 0),
                (ptr_attr::MAPPED, _) => out(data.cast::<c_uint>(), 1),
                (ptr_attr::DEVICE_ORDINAL, _) => out(data.cast::<c_int>(), 0),
                (ptr_attr::RANGE_START_ADDR, Owner::Device { base, .. }) => {
                    out(data.cast::<u64>(), base)
                }
                (ptr_attr::RANGE_START_ADDR, Owner::Host { base, .. }) => {
                    out(data.cast::<u64>(), base as u64)
                }
                (ptr_attr::RANGE_SIZE, Owner::Device { size, .. }) => {
                    out(data.cast::<usize>(), size as usize)
                }
                (ptr_attr::RANGE_SIZE, Owner::Host { size, .. }) => out(data.cast::<usize>(), size),
                _ => {
                    crate::api::stubs::log_once("cuPointerGetAttribute (this attribute)");
                    Err(res::NOT_SUPPORTED)
                }
            }
        }
    })
}
