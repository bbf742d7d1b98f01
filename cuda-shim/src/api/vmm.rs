//! CUDA's virtual memory management (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`, ...) over the device's `VA_RESERVE`, `MEM_CREATE`, `MEM_MAP` and the
//! rest (capability `VIRTUAL_MEMORY`, docs/cuda-api.md "Virtual memory management"). The
//! worker keeps and checks every object; the library mirrors them to answer queries
//! (`cuMemGetAccess`, `cuMemGetAllocationPropertiesFromHandle`) and lists each mapping
//! among its allocations, so copies, memsets, kernel arguments and pointer queries treat
//! it like memory from `cuMemAlloc`. Shareable handles (export and import) are not
//! offered.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_ulonglong, c_void};

use crate::driver::{self, Alloc, Driver, Res};
use crate::types::{res, CUdeviceptr, CUresult};
use crate::{guard, out};

/// `CUmemGenericAllocationHandle`.
pub type CUmemGenericAllocationHandle = c_ulonglong;

/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
const ALLOCATION_TYPE_PINNED: c_int = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_TYPE_DEVICE: c_int = 1;
/// `CU_MEM_LOCATION_TYPE_HOST` .. `HOST_NUMA_CURRENT`: locations a vGPU has no memory in.
const LOCATION_TYPES_HOST: std::ops::RangeInclusive<c_int> = 2..=4;
/// Every `CUmemAllocationHandleType` bit (POSIX fd, Win32, Win32 KMT, fabric).
const HANDLE_TYPES: c_int = 0xf;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const ACCESS_READWRITE: c_int = 3;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`, `..._RECOMMENDED`.
const GRANULARITY_FLAGS: std::ops::RangeInclusive<c_int> = 0..=1;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUmemLocation {
    pub type_: c_int,
    pub id: c_int,
}

/// `CUmemAllocationProp::allocFlags`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUmemAllocFlags {
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    pub type_: c_int,
    pub requested_handle_types: c_int,
    pub location: CUmemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: CUmemAllocFlags,
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_int,
}

const _: () = assert!(std::mem::size_of::<CUmemAllocationProp>() == 32);
const _: () = assert!(std::mem::size_of::<CUmemAccessDesc>() == 12);

/// A handle the program holds: its references and what it was created with.
#[derive(Clone, Copy, Debug)]
struct Handle {
    refs: u64,
    handle_types: c_int,
}

/// A mapping: its size, handle and the access the program set.
#[derive(Clone, Copy, Debug)]
struct Mapping {
    size: u64,
    access: c_int,
}

/// The library's mirror of the worker's virtual memory objects.
#[derive(Debug, Default)]
pub struct Vmm {
    handles: BTreeMap<u64, Handle>,
    maps: BTreeMap<u64, Mapping>,
}

/// The driver, with virtual memory management on this device (else NOT_SUPPORTED).
fn with_vmm<R>(what: &str, f: impl FnOnce(&mut Driver) -> Res<R>) -> Res<R> {
    driver::with(|d| {
        if d.info.features & vgpu_proto::features::VIRTUAL_MEMORY == 0 {
            crate::api::stubs::log_once(what);
            return Err(res::NOT_SUPPORTED);
        }
        f(d)
    })
}

/// Checks a location names this vGPU's device memory.
fn check_location(l: &CUmemLocation) -> Res<()> {
    match l.type_ {
        LOCATION_TYPE_DEVICE if l.id == 0 => Ok(()),
        LOCATION_TYPE_DEVICE => Err(res::INVALID_DEVICE),
        t if LOCATION_TYPES_HOST.contains(&t) => {
            crate::api::stubs::log_once("virtual memory in host memory");
            Err(res::NOT_SUPPORTED)
        }
        _ => Err(res::INVALID_VALUE),
    }
}

/// Reads and checks a `CUmemAllocationProp` from C.
///
/// # Safety
/// `prop` is NULL or points at a readable `CUmemAllocationProp`.
unsafe fn read_prop(prop: *const CUmemAllocationProp) -> Res<CUmemAllocationProp> {
    if prop.is_null() {
        return Err(res::INVALID_VALUE);
    }
    // SAFETY: non-null, readable by the caller's contract; unaligned read allowed.
    let p = unsafe { prop.read_unaligned() };
    if p.type_ != ALLOCATION_TYPE_PINNED || p.requested_handle_types & !HANDLE_TYPES != 0 {
        return Err(res::INVALID_VALUE);
    }
    check_location(&p.location)?;
    Ok(p)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: c_int,
) -> CUresult {
    guard("cuMemGetAllocationGranularity", || {
        with_vmm("cuMemGetAllocationGranularity", |_| Ok(()))?;
        // SAFETY: the caller passes a readable property struct (or NULL).
        unsafe { read_prop(prop)? };
        if granularity.is_null() || !GRANULARITY_FLAGS.contains(&option) {
            return Err(res::INVALID_VALUE);
        }
        // The minimum and the recommended granularity are the same, as the driver's on
        // the GPUs vgpu runs on (2 MiB).
        // SAFETY: a writable size_t from the caller.
        unsafe { out(granularity, vgpu_proto::VMM_GRANULARITY as usize) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: c_ulonglong,
) -> CUresult {
    guard("cuMemAddressReserve", || {
        let va = with_vmm("cuMemAddressReserve", |d| {
            if ptr.is_null() || size == 0 || flags != 0 {
                return Err(res::INVALID_VALUE);
            }
            let t = d.t.clone();
            let va = d
                .queue(0)?
                .call(&t, |s| s.va_reserve(size as u64, alignment as u64, addr))?;
            tracing::debug!(size, alignment, hint = addr, va, "cuMemAddressReserve");
            Ok(va)
        })?;
        // SAFETY: checked non-null; a writable CUdeviceptr from the caller.
        unsafe { out(ptr, va) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard("cuMemAddressFree", || {
        with_vmm("cuMemAddressFree", |d| {
            let t = d.t.clone();
            d.queue(0)?.call(&t, |s| s.va_free(ptr, size as u64))
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> CUresult {
    guard("cuMemCreate", || {
        let h = with_vmm("cuMemCreate", |d| {
            // SAFETY: the caller passes a readable property struct (or NULL).
            let p = unsafe { read_prop(prop)? };
            if handle.is_null() || size == 0 || flags != 0 {
                return Err(res::INVALID_VALUE);
            }
            let t = d.t.clone();
            let (h, _) = d.queue(0)?.call(&t, |s| s.mem_create(size as u64))?;
            tracing::debug!(
                size,
                handle = h,
                handle_types = p.requested_handle_types,
                "cuMemCreate"
            );
            d.vmm.handles.insert(
                h,
                Handle {
                    refs: 1,
                    handle_types: p.requested_handle_types,
                },
            );
            Ok(h)
        })?;
        // SAFETY: checked non-null; a writable handle from the caller.
        unsafe { out(handle, h) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    guard("cuMemRelease", || {
        with_vmm("cuMemRelease", |d| {
            if !d.vmm.handles.contains_key(&handle) {
                return Err(res::INVALID_VALUE);
            }
            let t = d.t.clone();
            d.queue(0)?.call(&t, |s| s.mem_release(handle))?;
            if let Some(h) = d.vmm.handles.get_mut(&handle) {
                h.refs -= 1;
                if h.refs == 0 {
                    d.vmm.handles.remove(&handle);
                }
            }
            Ok(())
        })
    })
}

#[no_mangle]
pub extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> CUresult {
    guard("cuMemMap", || {
        with_vmm("cuMemMap", |d| {
            if flags != 0 || size == 0 {
                return Err(res::INVALID_VALUE);
            }
            let t = d.t.clone();
            d.queue(0)?
                .call(&t, |s| s.mem_map(ptr, size as u64, offset as u64, handle))?;
            tracing::debug!(ptr, size, handle, "cuMemMap");
            d.vmm.maps.insert(
                ptr,
                Mapping {
                    size: size as u64,
                    access: 0,
                },
            );
            let ctx = d.current_ctx().unwrap_or(d.primary);
            let id = d.handle();
            d.allocs.insert(
                ptr,
                Alloc {
                    size: size as u64,
                    ctx,
                    id,
                    module: 0,
                    vmm: true,
                },
            );
            Ok(())
        })
    })
}

#[no_mangle]
pub extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard("cuMemUnmap", || {
        with_vmm("cuMemUnmap", |d| {
            // Work already queued on the memory completes first, as for cuMemFree.
            let t = d.t.clone();
            d.drain_all();
            d.queue(0)?.call(&t, |s| s.mem_unmap(ptr, size as u64))?;
            let end = ptr.saturating_add(size as u64);
            let gone: Vec<u64> = d.vmm.maps.range(ptr..end).map(|(a, _)| *a).collect();
            for a in gone {
                d.vmm.maps.remove(&a);
                d.allocs.remove(&a);
            }
            Ok(())
        })
    })
}

/// The mappings covering `[ptr, ptr + size)` without a gap, or INVALID_VALUE.
fn covering(v: &Vmm, ptr: u64, size: u64) -> Res<Vec<u64>> {
    let end = ptr
        .checked_add(size)
        .filter(|_| size > 0)
        .ok_or(res::INVALID_VALUE)?;
    let (&first, m) = v.maps.range(..=ptr).next_back().ok_or(res::INVALID_VALUE)?;
    if first + m.size <= ptr {
        return Err(res::INVALID_VALUE);
    }
    let mut at = first;
    let mut all = Vec::new();
    while at < end {
        let m = v.maps.get(&at).ok_or(res::INVALID_VALUE)?;
        all.push(at);
        at += m.size;
    }
    Ok(all)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    guard("cuMemSetAccess", || {
        with_vmm("cuMemSetAccess", |d| {
            if desc.is_null() || count == 0 {
                return Err(res::INVALID_VALUE);
            }
            let mut flags = None;
            for i in 0..count {
                // SAFETY: `desc` holds `count` descriptors (API contract).
                let a = unsafe { desc.add(i).read_unaligned() };
                check_location(&a.location)?;
                match a.flags {
                    ACCESS_READWRITE => flags = Some(a.flags),
                    // Read-only or revoked access cannot be enforced: the worker maps
                    // device memory read-write for the vGPU's kernels.
                    0 | 1 => {
                        crate::api::stubs::log_once("cuMemSetAccess other than read-write");
                        return Err(res::NOT_SUPPORTED);
                    }
                    _ => return Err(res::INVALID_VALUE),
                }
            }
            let maps = covering(&d.vmm, ptr, size as u64)?;
            if let Some(f) = flags {
                for a in maps {
                    if let Some(m) = d.vmm.maps.get_mut(&a) {
                        m.access = f;
                    }
                }
            }
            Ok(())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAccess(
    flags: *mut c_ulonglong,
    location: *const CUmemLocation,
    ptr: CUdeviceptr,
) -> CUresult {
    guard("cuMemGetAccess", || {
        let f = with_vmm("cuMemGetAccess", |d| {
            if flags.is_null() || location.is_null() {
                return Err(res::INVALID_VALUE);
            }
            // SAFETY: non-null, readable by the caller's contract.
            let l = unsafe { location.read_unaligned() };
            let (&start, m) = d
                .vmm
                .maps
                .range(..=ptr)
                .next_back()
                .ok_or(res::INVALID_VALUE)?;
            if ptr - start >= m.size {
                return Err(res::INVALID_VALUE);
            }
            match check_location(&l) {
                Ok(()) => Ok(m.access as c_ulonglong),
                // Host memory never has access to the vGPU's device memory.
                Err(res::NOT_SUPPORTED) => Ok(0),
                Err(e) => Err(e),
            }
        })?;
        // SAFETY: checked non-null; a writable unsigned long long from the caller.
        unsafe { out(flags, f) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    guard("cuMemRetainAllocationHandle", || {
        let h = with_vmm("cuMemRetainAllocationHandle", |d| {
            if handle.is_null() {
                return Err(res::INVALID_VALUE);
            }
            let t = d.t.clone();
            let [h, ..] = d.queue(0)?.call(&t, |s| s.mem_retain(addr as u64))?;
            d.vmm
                .handles
                .entry(h)
                .and_modify(|e| e.refs += 1)
                .or_insert(Handle {
                    refs: 1,
                    handle_types: 0,
                });
            Ok(h)
        })?;
        // SAFETY: checked non-null; a writable handle from the caller.
        unsafe { out(handle, h) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut CUmemAllocationProp,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    guard("cuMemGetAllocationPropertiesFromHandle", || {
        let h = with_vmm("cuMemGetAllocationPropertiesFromHandle", |d| {
            d.vmm
                .handles
                .get(&handle)
                .copied()
                .ok_or(res::INVALID_VALUE)
        })?;
        let p = CUmemAllocationProp {
            type_: ALLOCATION_TYPE_PINNED,
            requested_handle_types: h.handle_types,
            location: CUmemLocation {
                type_: LOCATION_TYPE_DEVICE,
                id: 0,
            },
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: CUmemAllocFlags::default(),
        };
        // SAFETY: a writable CUmemAllocationProp from the caller.
        unsafe { out(prop, p) }
    })
}
