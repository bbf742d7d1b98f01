//! Stateless driver calls of the virtual memory management API the cuda backend's device
//! memory (`memory.rs`) is built on: device handles and peer access, access descriptors,
//! physical allocation properties and granularity, and the device's free memory.

use cudarc::driver::sys;

use super::driver::{check, CuError};
use super::memory::{round_up, VA_ALIGN};

/// The CUdevice of GPU `ordinal`.
fn device_of(ordinal: i32) -> std::result::Result<sys::CUdevice, CuError> {
    let mut dev: sys::CUdevice = 0;
    check(
        // SAFETY: writes one device handle into `dev`.
        unsafe { sys::cuDeviceGet(&mut dev, ordinal) },
        "cuDeviceGet",
    )?;
    Ok(dev)
}

/// Whether GPU `from` can reach GPU `to`'s memory directly (NVLink or PCIe peer to peer).
pub(super) fn can_access_peer(from: i32, to: i32) -> bool {
    let (Ok(f), Ok(t)) = (device_of(from), device_of(to)) else {
        return false;
    };
    let mut ok = 0;
    // SAFETY: writes one int into `ok`; both handles came from cuDeviceGet.
    let rc = unsafe { sys::cuDeviceCanAccessPeer(&mut ok, f, t) };
    rc == sys::CUresult::CUDA_SUCCESS && ok == 1
}

/// Read-write access for GPU `ordinal`.
pub(super) fn access_desc(ordinal: i32) -> sys::CUmemAccessDesc {
    sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal,
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    }
}

/// Physical allocation properties: pinned device memory on GPU `ordinal`.
pub(super) fn alloc_prop(ordinal: i32) -> sys::CUmemAllocationProp {
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
pub(super) fn granularity(ordinal: i32) -> std::result::Result<u64, CuError> {
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

/// Free and total memory of the current context's device.
pub(super) fn mem_info() -> std::result::Result<(u64, u64), CuError> {
    let (mut free, mut total) = (0usize, 0usize);
    check(
        // SAFETY: writes two usizes.
        unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) },
        "cuMemGetInfo",
    )?;
    Ok((free as u64, total as u64))
}
