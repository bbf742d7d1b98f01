//! CLUSTER_PROTOTYPE, the driver's private table of thread block cluster calls
//! (`cuGetExportTable` with UUID `1734dc26-800d-4745-8726-c0f1e7dd8bca`). cuBLASLt asks
//! for it before its Hopper GEMMs (bf16 and fp16 among them) and calls it without
//! checking that it got one: it sets a kernel's cluster shape on the function here, then
//! launches with a plain `cuLaunchKernel`. Each slot is the public function attribute or
//! occupancy call it mirrors; what a vGPU cannot tell (the GPU's TPC layout) answers
//! CUDA_ERROR_NOT_SUPPORTED. docs/cuda-api.md lists the slots.

use std::ffi::{c_int, c_uchar, c_uint};

use super::export::{size_of_table, Slot, Table};
use super::func::{fattr, get_attribute, set_attribute};
use crate::driver::{self, Res};
use crate::types::{res, CUdevice, CUfunction, CUresult};
use crate::{guard, out};

/// The table's UUID as the program passes it (bytes in memory order).
pub(super) const UUID: [u8; 16] = [
    0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca,
];

/// `CUclusterSchedulingPolicy`'s largest value (`..._LOAD_BALANCING`).
const MAX_POLICY: c_int = 2;

/// The cluster size a device launches at most, as slot 11 reports it (the override is not
/// kept: a vGPU checks every launch against `vgpu_proto::MAX_CLUSTER_BLOCKS`).
const MAX_DEVICE_CLUSTER: u32 = vgpu_proto::MAX_CLUSTER_BLOCKS;

/// Slot 1: the cluster every later launch of the function uses (all zero: none).
extern "C" fn set_cluster_dim(f: CUfunction, x: c_int, y: c_int, z: c_int) -> CUresult {
    guard("cluster table: set function cluster", || {
        let dims = [x, y, z];
        if !(dims == [0, 0, 0] || dims.iter().all(|&v| v > 0)) {
            return Err(res::INVALID_VALUE);
        }
        driver::with(|d| {
            for (i, v) in dims.into_iter().enumerate() {
                set_attribute(d, f, fattr::REQUIRED_CLUSTER_WIDTH + i as c_int, v)?;
            }
            Ok(())
        })
    })
}

/// Slot 2: the function's cluster scheduling policy.
extern "C" fn set_policy(f: CUfunction, policy: c_int) -> CUresult {
    guard("cluster table: set scheduling policy", || {
        if !(0..=MAX_POLICY).contains(&policy) {
            return Err(res::INVALID_VALUE);
        }
        driver::with(|d| set_attribute(d, f, fattr::CLUSTER_SCHEDULING_POLICY_PREFERENCE, policy))
    })
}

/// Slot 3: clusters above the portable size allowed for the function.
extern "C" fn set_non_portable(f: CUfunction, enable: c_int) -> CUresult {
    guard("cluster table: allow non-portable cluster sizes", || {
        driver::with(|d| {
            set_attribute(
                d,
                f,
                fattr::NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                c_int::from(enable != 0),
            )
        })
    })
}

/// Slots 4 (the GPU's TPC to GPC mapping) and 15 (its first singleton GPC): the vGPU does
/// not expose the GPU's layout.
extern "C" fn gpu_layout() -> CUresult {
    guard("cluster table: GPU layout", || {
        crate::api::stubs::log_once("the GPU's TPC and GPC layout");
        Err(res::NOT_SUPPORTED)
    })
}

/// Reads one function attribute into `value`.
fn attribute_out(f: CUfunction, attrib: c_int, value: *mut c_int) -> Res<()> {
    let v = driver::with(|d| get_attribute(d, f, attrib))?;
    // SAFETY: a writable int from the caller (NULL refused).
    unsafe { out(value, v) }
}

/// Slot 5: the function's cluster (zeros: none set).
unsafe extern "C" fn cluster_dim(
    f: CUfunction,
    x: *mut c_int,
    y: *mut c_int,
    z: *mut c_int,
) -> CUresult {
    guard("cluster table: function cluster", || {
        if x.is_null() || y.is_null() || z.is_null() {
            return Err(res::INVALID_VALUE);
        }
        attribute_out(f, fattr::REQUIRED_CLUSTER_WIDTH, x)?;
        attribute_out(f, fattr::REQUIRED_CLUSTER_HEIGHT, y)?;
        attribute_out(f, fattr::REQUIRED_CLUSTER_DEPTH, z)
    })
}

/// Slot 6: the function's scheduling policy.
unsafe extern "C" fn policy(f: CUfunction, value: *mut c_int) -> CUresult {
    guard("cluster table: scheduling policy", || {
        attribute_out(f, fattr::CLUSTER_SCHEDULING_POLICY_PREFERENCE, value)
    })
}

/// Slot 7: whether the function may launch non-portable cluster sizes.
unsafe extern "C" fn non_portable(f: CUfunction, value: *mut c_int) -> CUresult {
    guard("cluster table: non-portable cluster sizes", || {
        attribute_out(f, fattr::NON_PORTABLE_CLUSTER_SIZE_ALLOWED, value)
    })
}

/// Slot 8: whether the device launches clusters (`CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH`).
unsafe extern "C" fn cluster_launch(dev: CUdevice, value: *mut c_int) -> CUresult {
    guard("cluster table: cluster launch supported", || {
        let v = driver::with(|d| {
            super::device::check_dev(dev)?;
            super::device::attribute(d, crate::types::attr::CLUSTER_LAUNCH)
        })?;
        // SAFETY: a writable int from the caller (NULL refused).
        unsafe { out(value, v) }
    })
}

/// Slot 9: the largest cluster the function may launch in (`cuOccupancyMaxPotentialClusterSize`).
unsafe extern "C" fn max_cluster_size(
    f: CUfunction,
    block: c_int,
    shared: usize,
    value: *mut c_int,
) -> CUresult {
    guard("cluster table: largest cluster", || {
        if block <= 0 {
            return Err(res::INVALID_VALUE);
        }
        let v = driver::with(|d| {
            super::cluster_occupancy::potential_cluster_size(
                d,
                f,
                [block as u32, 1, 1],
                shared as u64,
            )
        })?
        .answer()?;
        // SAFETY: a writable int from the caller (NULL refused).
        unsafe { out(value, super::cluster_occupancy::as_int(v)) }
    })
}

/// Slot 10: clusters of `size` blocks that run at once (`cuOccupancyMaxActiveClusters`).
unsafe extern "C" fn active_clusters(
    f: CUfunction,
    block: c_int,
    shared: usize,
    size: c_int,
    value: *mut c_int,
) -> CUresult {
    guard("cluster table: active clusters", || {
        if block <= 0 || size <= 0 {
            return Err(res::INVALID_VALUE);
        }
        let n = driver::with(|d| {
            super::cluster_occupancy::active_clusters(
                d,
                f,
                [block as u32, 1, 1],
                shared as u64,
                [size as u32, 1, 1],
            )
        })?
        .answer()?;
        // SAFETY: a writable int from the caller (NULL refused).
        unsafe { out(value, super::cluster_occupancy::as_int(n)) }
    })
}

/// Slot 11: overrides the device's largest cluster and answers the old value; the vGPU
/// keeps its own limit and answers it.
extern "C" fn override_device_cluster(dev: c_int, size: c_uint) -> c_uint {
    tracing::debug!(
        dev,
        size,
        "cluster table: device cluster size override ignored"
    );
    MAX_DEVICE_CLUSTER
}

/// Slot 12: whether the function must be launched in clusters (compiled with a required
/// cluster shape).
unsafe extern "C" fn must_be_set(f: CUfunction, value: *mut c_int) -> CUresult {
    guard("cluster table: cluster must be set", || {
        attribute_out(f, fattr::CLUSTER_SIZE_MUST_BE_SET, value)
    })
}

/// Slot 13: frees what slot 4 handed out; it hands out nothing, so only NULLs are valid.
extern "C" fn free_layout(vgpc: *mut c_uchar, mtpc: *mut c_uchar) -> CUresult {
    if vgpc.is_null() && mtpc.is_null() {
        res::SUCCESS
    } else {
        res::INVALID_VALUE
    }
}

/// Slot 14: cluster attributes for kernels launched from the device (CUDA dynamic
/// parallelism): not offered.
unsafe extern "C" fn cnp_cluster_attributes(value: *mut c_int) -> CUresult {
    // SAFETY: a writable int from the caller (NULL refused).
    guard("cluster table: CNP cluster attributes", || unsafe {
        out(value, 0)
    })
}

/// Slot 16: preferred cluster shapes (`CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION`
/// honoured as such): not offered, a launch uses its required cluster.
unsafe extern "C" fn preferred_clusters(dev: CUdevice, value: *mut c_int) -> CUresult {
    guard("cluster table: preferred clusters", || {
        super::device::check_dev(dev)?;
        // SAFETY: a writable int from the caller (NULL refused).
        unsafe { out(value, 0) }
    })
}

pub(super) static TABLE: Table<17> = Table([
    size_of_table(17),
    set_cluster_dim as Slot,
    set_policy as Slot,
    set_non_portable as Slot,
    gpu_layout as Slot,
    cluster_dim as Slot,
    policy as Slot,
    non_portable as Slot,
    cluster_launch as Slot,
    max_cluster_size as Slot,
    active_clusters as Slot,
    override_device_cluster as Slot,
    must_be_set as Slot,
    free_layout as Slot,
    cnp_cluster_attributes as Slot,
    gpu_layout as Slot,
    preferred_clusters as Slot,
]);
