//! The physical GPU's attributes for `GET_ATTRIBUTES`, read once with
//! `cuDeviceGetAttribute`. An attribute this driver does not know reads as the sim value.

use std::ffi::c_int;

use cudarc::driver::sys::{self, CUdevice_attribute, CUresult};
use vgpu_proto::DeviceAttributes;

/// One attribute, or `fallback` where the driver does not answer it.
fn get(dev: sys::CUdevice, attr: CUdevice_attribute, fallback: u32) -> u32 {
    let mut v: c_int = 0;
    // SAFETY: writes one int into `v`, which lives on this frame.
    let rc = unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) };
    if rc != CUresult::CUDA_SUCCESS {
        tracing::debug!(?attr, ?rc, "device attribute not available");
        return fallback;
    }
    u32::try_from(v).unwrap_or(fallback)
}

/// Whether `dev` has the Tensor Memory Accelerator (compute capability 9.0 or higher:
/// `CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED`).
pub(super) fn tensor_maps(dev: sys::CUdevice) -> bool {
    get(
        dev,
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED,
        0,
    ) == 1
}

/// The attributes of `dev`.
pub(super) fn read(dev: sys::CUdevice) -> DeviceAttributes {
    use CUdevice_attribute::*;
    let s = DeviceAttributes::SIM;
    DeviceAttributes {
        cc_major: get(
            dev,
            CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            s.cc_major,
        ),
        cc_minor: get(
            dev,
            CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            s.cc_minor,
        ),
        sm_count: get(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, s.sm_count),
        clock_khz: get(dev, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, s.clock_khz),
        memory_clock_khz: get(
            dev,
            CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE,
            s.memory_clock_khz,
        ),
        memory_bus_width: get(
            dev,
            CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH,
            s.memory_bus_width,
        ),
        l2_cache_bytes: get(dev, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, s.l2_cache_bytes),
        max_threads_per_block: get(
            dev,
            CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            s.max_threads_per_block,
        ),
        max_block_dim: [
            get(dev, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, s.max_block_dim[0]),
            get(dev, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, s.max_block_dim[1]),
            get(dev, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, s.max_block_dim[2]),
        ],
        max_grid_dim: [
            get(dev, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, s.max_grid_dim[0]),
            get(dev, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, s.max_grid_dim[1]),
            get(dev, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, s.max_grid_dim[2]),
        ],
        max_shared_per_block: get(
            dev,
            CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
            s.max_shared_per_block,
        ),
        max_shared_per_block_optin: get(
            dev,
            CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            s.max_shared_per_block_optin,
        ),
        max_shared_per_sm: get(
            dev,
            CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            s.max_shared_per_sm,
        ),
        max_registers_per_block: get(
            dev,
            CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK,
            s.max_registers_per_block,
        ),
        max_registers_per_sm: get(
            dev,
            CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
            s.max_registers_per_sm,
        ),
        warp_size: get(dev, CU_DEVICE_ATTRIBUTE_WARP_SIZE, s.warp_size),
        max_threads_per_sm: get(
            dev,
            CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
            s.max_threads_per_sm,
        ),
        max_blocks_per_sm: get(
            dev,
            CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR,
            s.max_blocks_per_sm,
        ),
        total_const_memory: get(
            dev,
            CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY,
            s.total_const_memory,
        ),
        async_engine_count: get(
            dev,
            CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT,
            s.async_engine_count,
        ),
        concurrent_kernels: get(
            dev,
            CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS,
            s.concurrent_kernels,
        ),
        ecc_enabled: get(dev, CU_DEVICE_ATTRIBUTE_ECC_ENABLED, s.ecc_enabled),
        pci_domain_id: get(dev, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0),
        pci_bus_id: get(dev, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0),
        pci_device_id: get(dev, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0),
        stack_bytes: 0,
        heap_kib: 0,
        printf_fifo_kib: 0,
    }
}
