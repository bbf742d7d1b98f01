//! Initialisation, versions, devices, device attributes, error names.

use std::ffi::{c_char, c_int, c_uint};

use crate::driver::{self, Driver};
use crate::types::{attr, c_str_ptr, error_text, res, CUdevice, CUresult, CUuuid, DRIVER_VERSION};
use crate::{guard, out};

/// What the library answers on a device that cannot report the physical GPU's attributes
/// (protocol 1.0): an H200's values, with the vGPU's compute units as its SM count.
pub fn fixed_attributes(info: &vgpu_proto::DeviceInfo) -> vgpu_proto::DeviceAttributes {
    vgpu_proto::DeviceAttributes {
        sm_count: info.compute_units.max(1),
        clock_khz: 1_980_000,
        memory_clock_khz: 2_619_000,
        memory_bus_width: 6144,
        async_engine_count: 1,
        ..vgpu_proto::DeviceAttributes::SIM
    }
}

pub(crate) fn check_dev(dev: CUdevice) -> Result<(), CUresult> {
    if dev == 0 {
        Ok(())
    } else {
        Err(res::INVALID_DEVICE)
    }
}

#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    guard("cuInit", || {
        if flags != 0 {
            return Err(res::INVALID_VALUE);
        }
        match driver::init() {
            res::SUCCESS => Ok(()),
            e => Err(e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    // SAFETY: the caller passes a writable int (or NULL, refused).
    guard("cuDriverGetVersion", || unsafe {
        out(version, DRIVER_VERSION)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    guard("cuDeviceGetCount", || {
        driver::with(|_| Ok(()))?;
        // SAFETY: a writable int from the caller.
        unsafe { out(count, 1) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    guard("cuDeviceGet", || {
        driver::with(|_| Ok(()))?;
        if device.is_null() {
            return Err(res::INVALID_VALUE);
        }
        check_dev(ordinal)?;
        // SAFETY: a writable CUdevice from the caller.
        unsafe { out(device, 0) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    guard("cuDeviceGetName", || {
        let text = driver::with(|d| Ok(format!("vGPU {}", d.info.name_str())))?;
        if name.is_null() || len <= 0 {
            return Err(res::INVALID_VALUE);
        }
        check_dev(dev)?;
        let bytes = text.as_bytes();
        let n = bytes.len().min(len as usize - 1);
        // SAFETY: the caller's buffer holds `len` bytes; we write n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), name.cast::<u8>(), n);
            name.add(n).write(0);
        }
        Ok(())
    })
}

pub(crate) fn uuid_of(d: &Driver) -> CUuuid {
    // A stable identity per vGPU: "vGPU" and the host-wide vGPU id.
    let mut bytes = [0u8; 16];
    bytes[..4].copy_from_slice(b"vGPU");
    bytes[4..8].copy_from_slice(&d.info.vgpu_id.to_le_bytes());
    bytes[8..16].copy_from_slice(&d.info.va_base.to_le_bytes());
    CUuuid {
        bytes: bytes.map(|b| b as c_char),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    guard("cuDeviceGetUuid", || {
        let u = driver::with(|d| Ok(uuid_of(d)))?;
        check_dev(dev)?;
        // SAFETY: a writable CUuuid from the caller.
        unsafe { out(uuid, u) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuDeviceGetUuid(uuid, dev) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guard("cuDeviceTotalMem_v2", || {
        let total = driver::with(|d| Ok(d.info.memory_share))?;
        check_dev(dev)?;
        // SAFETY: a writable size_t from the caller.
        unsafe { out(bytes, total as usize) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceComputeCapability(
    major: *mut c_int,
    minor: *mut c_int,
    dev: CUdevice,
) -> CUresult {
    guard("cuDeviceComputeCapability", || {
        check_dev(dev)?;
        if major.is_null() || minor.is_null() {
            return Err(res::INVALID_VALUE);
        }
        let (ma, mi) = driver::with(|d| {
            Ok((
                attribute(d, attr::COMPUTE_CAPABILITY_MAJOR)?,
                attribute(d, attr::COMPUTE_CAPABILITY_MINOR)?,
            ))
        })?;
        // SAFETY: both checked non-null; writable ints from the caller.
        unsafe {
            out(major, ma)?;
            out(minor, mi)
        }
    })
}

/// The value of a device attribute: from the physical GPU's attributes (`GET_ATTRIBUTES`)
/// or `GET_INFO` where the device reports it, else the fixed value docs/cuda-api.md lists;
/// 0 (absent) for every other attribute CUDA 13.0 defines.
pub fn attribute(d: &Driver, a: c_int) -> Result<c_int, CUresult> {
    let clamp = |v: u64| v.min(c_int::MAX as u64) as c_int;
    let v = |x: u32| clamp(u64::from(x));
    let g = &d.attributes;
    Ok(match a {
        attr::MAX_THREADS_PER_BLOCK => v(g.max_threads_per_block),
        attr::MAX_BLOCK_DIM_X => v(g.max_block_dim[0]),
        attr::MAX_BLOCK_DIM_Y => v(g.max_block_dim[1]),
        attr::MAX_BLOCK_DIM_Z => v(g.max_block_dim[2]),
        attr::MAX_GRID_DIM_X => v(g.max_grid_dim[0]),
        attr::MAX_GRID_DIM_Y => v(g.max_grid_dim[1]),
        attr::MAX_GRID_DIM_Z => v(g.max_grid_dim[2]),
        attr::MAX_SHARED_MEMORY_PER_BLOCK => v(g.max_shared_per_block),
        attr::TOTAL_CONSTANT_MEMORY => v(g.total_const_memory),
        attr::WARP_SIZE => v(g.warp_size),
        attr::MAX_PITCH => c_int::MAX,
        attr::MAX_REGISTERS_PER_BLOCK => v(g.max_registers_per_block),
        attr::MAX_REGISTERS_PER_MULTIPROCESSOR => v(g.max_registers_per_sm),
        attr::CLOCK_RATE => v(g.clock_khz),
        attr::TEXTURE_ALIGNMENT => 512,
        attr::GPU_OVERLAP | attr::UNIFIED_ADDRESSING => 1,
        // Pool memory (cuMemHostAlloc) is device-mapped when the worker maps it
        // (host_map.rs); registered memory never is.
        attr::CAN_MAP_HOST_MEMORY => c_int::from(d.host_mapped.any()),
        attr::CONCURRENT_KERNELS => v(g.concurrent_kernels),
        attr::ECC_ENABLED => v(g.ecc_enabled),
        attr::MULTIPROCESSOR_COUNT => v(g.sm_count.max(1)),
        attr::PCI_BUS_ID => v(g.pci_bus_id),
        attr::PCI_DOMAIN_ID => v(g.pci_domain_id),
        // The vGPU, not the physical GPU behind it, is the device a program sees.
        attr::PCI_DEVICE_ID => v(d.info.vgpu_id),
        attr::MEMORY_CLOCK_RATE => v(g.memory_clock_khz),
        attr::GLOBAL_MEMORY_BUS_WIDTH => v(g.memory_bus_width),
        attr::L2_CACHE_SIZE => v(g.l2_cache_bytes),
        attr::MAX_THREADS_PER_MULTIPROCESSOR => v(g.max_threads_per_sm),
        attr::ASYNC_ENGINE_COUNT => v(g.async_engine_count),
        attr::COMPUTE_CAPABILITY_MAJOR => v(g.cc_major),
        attr::COMPUTE_CAPABILITY_MINOR => v(g.cc_minor),
        attr::GLOBAL_L1_CACHE_SUPPORTED | attr::LOCAL_L1_CACHE_SUPPORTED => 1,
        attr::MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => v(g.max_shared_per_sm),
        attr::SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO => 2,
        attr::COMPUTE_PREEMPTION_SUPPORTED | attr::HOST_REGISTER_SUPPORTED => 1,
        // A launch may ask for no more than the device accepts.
        attr::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => v(g
            .max_shared_per_block_optin
            .min(vgpu_proto::MAX_SHARED_BYTES)),
        attr::MAX_BLOCKS_PER_MULTIPROCESSOR => v(g.max_blocks_per_sm),
        attr::RESERVED_SHARED_MEMORY_PER_BLOCK => 1024,
        // Stream-ordered allocation and pools (api/pool.rs).
        attr::MEMORY_POOLS_SUPPORTED => 1,
        // Thread block clusters (api/launch_ex.rs).
        attr::CLUSTER_LAUNCH => c_int::from(d.info.features & vgpu_proto::features::CLUSTERS != 0),
        // TMA descriptors are encoded by the worker's GPU driver (api/tensor_map.rs).
        attr::TENSOR_MAP_ACCESS_SUPPORTED => {
            c_int::from(d.info.features & vgpu_proto::features::TENSOR_MAPS != 0)
        }
        // Reserved ranges, physical allocations and mappings (api/vmm.rs). Shareable
        // handles (POSIX file descriptor, Win32, fabric) answer 0 below: not offered.
        attr::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED => {
            c_int::from(d.info.features & vgpu_proto::features::VIRTUAL_MEMORY != 0)
        }
        a if (1..attr::MAX).contains(&a) => 0,
        _ => return Err(res::INVALID_VALUE),
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(pi: *mut c_int, a: c_int, dev: CUdevice) -> CUresult {
    guard("cuDeviceGetAttribute", || {
        let v = driver::with(|d| {
            check_dev(dev)?;
            attribute(d, a)
        })?;
        tracing::trace!(attribute = a, value = v, "cuDeviceGetAttribute");
        // SAFETY: a writable int from the caller.
        unsafe { out(pi, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut c_int,
    dev: CUdevice,
    peer: CUdevice,
) -> CUresult {
    guard("cuDeviceCanAccessPeer", || {
        driver::with(|_| Ok(()))?;
        check_dev(dev)?;
        check_dev(peer)?;
        // SAFETY: a writable int from the caller.
        unsafe { out(can, 0) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, text: *mut *const c_char) -> CUresult {
    guard("cuGetErrorName", || {
        let found = error_text(error);
        // SAFETY: a writable `const char*` from the caller.
        unsafe { out(text, found.map_or(std::ptr::null(), |(n, _)| c_str_ptr(n)))? };
        found.map(drop).ok_or(res::INVALID_VALUE)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, text: *mut *const c_char) -> CUresult {
    guard("cuGetErrorString", || {
        let found = error_text(error);
        // SAFETY: a writable `const char*` from the caller.
        unsafe { out(text, found.map_or(std::ptr::null(), |(_, s)| c_str_ptr(s)))? };
        found.map(drop).ok_or(res::INVALID_VALUE)
    })
}
