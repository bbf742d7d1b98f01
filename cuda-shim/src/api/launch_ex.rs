//! `cuLaunchKernelEx`: a launch described by a `CUlaunchConfig` and its attributes. The
//! attributes that are hints or orderings a vGPU launch already satisfies are honoured
//! by the launch as it is (priority, access policy window, synchronisation policy,
//! memory sync domains, shared memory carveout, programmatic stream serialisation: the
//! stream stays fully serialised; a preferred cluster size: the required one is used).
//! Thread block clusters (`CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`) run on a vGPU that
//! offers them (`features::CLUSTERS`: a cuda vGPU on compute capability 9.0 or newer;
//! `CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH` answers 1 there), up to 16 blocks. Cooperative
//! launches are not offered (`CUDA_ERROR_NOT_SUPPORTED`, as on a device without them;
//! `CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH` answers 0), nor are the attributes that
//! record events from inside the kernel. Cluster occupancy
//! (`cuOccupancyMaxActiveClusters`, `cuOccupancyMaxPotentialClusterSize`) is answered by
//! the worker's driver on a cuda vGPU (`api/cluster_occupancy.rs`).

use std::ffi::{c_int, c_uint, c_void};

use crate::driver::{self, Res};
use crate::types::{res, CUfunction, CUresult, CUstream};
use crate::{guard, out};

/// `CUlaunchAttribute`: an id and a 64-byte value.
#[repr(C)]
pub struct LaunchAttribute {
    pub id: c_uint,
    pub pad: [u8; 4],
    pub value: [u8; 64],
}

/// `CUlaunchConfig`.
#[repr(C)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared: c_uint,
    pub stream: CUstream,
    pub attrs: *const LaunchAttribute,
    pub num_attrs: c_uint,
}

/// `CUlaunchAttributeID` values.
mod id {
    pub const IGNORE: u32 = 0;
    pub const ACCESS_POLICY_WINDOW: u32 = 1;
    pub const COOPERATIVE: u32 = 2;
    pub const SYNCHRONIZATION_POLICY: u32 = 3;
    pub const CLUSTER_DIMENSION: u32 = 4;
    pub const CLUSTER_SCHEDULING_POLICY_PREFERENCE: u32 = 5;
    pub const PROGRAMMATIC_STREAM_SERIALIZATION: u32 = 6;
    pub const PROGRAMMATIC_EVENT: u32 = 7;
    pub const PRIORITY: u32 = 8;
    pub const MEM_SYNC_DOMAIN_MAP: u32 = 9;
    pub const MEM_SYNC_DOMAIN: u32 = 10;
    pub const PREFERRED_CLUSTER_DIMENSION: u32 = 11;
    pub const LAUNCH_COMPLETION_EVENT: u32 = 12;
    pub const DEVICE_UPDATABLE_KERNEL_NODE: u32 = 13;
    pub const PREFERRED_SHARED_MEMORY_CARVEOUT: u32 = 14;
}

fn word(v: &[u8; 64], i: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&v[i * 4..i * 4 + 4]);
    u32::from_le_bytes(b)
}

/// Logs (debug, once per attribute and first value) a launch attribute the launch takes
/// as a hint and does not hand to the worker: what a program asked of its launches.
fn log_hint(a: &LaunchAttribute) {
    // Nothing to pay per launch unless someone reads the log.
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    static SEEN: std::sync::Mutex<Option<std::collections::HashSet<(u32, u32)>>> =
        std::sync::Mutex::new(None);
    let key = (a.id, word(&a.value, 0));
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen
        .get_or_insert_with(std::collections::HashSet::new)
        .insert(key)
    {
        tracing::debug!(
            attribute = a.id,
            value = key.1,
            "launch attribute taken as a hint, not applied on the vGPU"
        );
    }
}

/// Checks one attribute: Ok when the launch as it is satisfies it.
pub(crate) fn check_attribute(a: &LaunchAttribute) -> Result<(), CUresult> {
    match a.id {
        id::IGNORE
        | id::ACCESS_POLICY_WINDOW
        | id::SYNCHRONIZATION_POLICY
        | id::CLUSTER_SCHEDULING_POLICY_PREFERENCE
        | id::PROGRAMMATIC_STREAM_SERIALIZATION
        | id::PRIORITY
        | id::MEM_SYNC_DOMAIN_MAP
        | id::MEM_SYNC_DOMAIN
        | id::PREFERRED_SHARED_MEMORY_CARVEOUT => {
            log_hint(a);
            Ok(())
        }
        id::COOPERATIVE => {
            if word(&a.value, 0) == 0 {
                return Ok(());
            }
            crate::api::stubs::log_once("cooperative launches");
            Err(res::NOT_SUPPORTED)
        }
        // The size is checked with the launch (`launch::check_cluster`); a preferred size is a
        // hint the required one satisfies.
        id::CLUSTER_DIMENSION | id::PREFERRED_CLUSTER_DIMENSION => Ok(()),
        id::PROGRAMMATIC_EVENT | id::LAUNCH_COMPLETION_EVENT => {
            crate::api::stubs::log_once("launch attributes that record events");
            Err(res::NOT_SUPPORTED)
        }
        id::DEVICE_UPDATABLE_KERNEL_NODE => {
            if word(&a.value, 0) == 0 {
                return Ok(());
            }
            crate::api::stubs::log_once("device-updatable graph kernel nodes");
            Err(res::NOT_SUPPORTED)
        }
        _ => Err(res::INVALID_VALUE),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const LaunchConfig,
    f: CUfunction,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    guard("cuLaunchKernelEx", || {
        if config.is_null() {
            return Err(res::INVALID_VALUE);
        }
        // SAFETY: a readable CUlaunchConfig from the caller.
        let c = unsafe { &*config };
        if c.num_attrs > 0 && c.attrs.is_null() {
            return Err(res::INVALID_VALUE);
        }
        for i in 0..c.num_attrs as usize {
            // SAFETY: `attrs` holds `num_attrs` attributes (API contract).
            check_attribute(unsafe { &*c.attrs.add(i) })?;
        }
        // SAFETY: `attrs` holds `num_attrs` attributes (checked non-null above).
        let cluster = unsafe { cluster_dims(c)? };
        super::launch::launch(
            f,
            c.grid,
            c.block,
            c.shared,
            c.stream,
            kernel_params,
            extra,
            cluster,
        )
    })
}

/// The cluster a launch configuration asks for (its `CLUSTER_DIMENSION`; `[1, 1, 1]`
/// without one).
///
/// # Safety
/// `c.attrs` holds `c.num_attrs` attributes (API contract).
unsafe fn cluster_dims(c: &LaunchConfig) -> Res<[u32; 3]> {
    if c.num_attrs > 0 && c.attrs.is_null() {
        return Err(res::INVALID_VALUE);
    }
    let mut dims = [1, 1, 1];
    for i in 0..c.num_attrs as usize {
        // SAFETY: `attrs` holds `num_attrs` attributes (the caller's contract).
        let a = unsafe { &*c.attrs.add(i) };
        if a.id == id::CLUSTER_DIMENSION {
            dims = [word(&a.value, 0), word(&a.value, 1), word(&a.value, 2)];
            if dims.contains(&0) {
                return Err(res::INVALID_VALUE);
            }
        }
    }
    Ok(dims)
}

/// Clusters of `config`'s shape that run at once (see
/// [`super::cluster_occupancy::active_clusters`]): the launch's cluster, else the one the
/// program set on the function, else clusters of one block.
fn max_active_clusters(f: CUfunction, config: *const LaunchConfig) -> Res<u64> {
    if config.is_null() {
        return Err(res::INVALID_VALUE);
    }
    // SAFETY: a readable CUlaunchConfig from the caller.
    let c = unsafe { &*config };
    // SAFETY: its attribute array as the API documents it.
    let named = unsafe { cluster_dims(c)? };
    driver::with(|d| {
        // An unknown function is refused by the occupancy checks, in their order.
        let cluster = match named {
            [1, 1, 1] => {
                super::func::function(d, f).map_or([1, 1, 1], |func| func.cluster.launch_dims())
            }
            dims => dims,
        };
        super::cluster_occupancy::active_clusters(d, f, c.block, u64::from(c.shared), cluster)
    })?
    .answer()
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveClusters(
    num: *mut c_int,
    f: CUfunction,
    config: *const LaunchConfig,
) -> CUresult {
    guard("cuOccupancyMaxActiveClusters", || {
        let n = max_active_clusters(f, config).inspect_err(|&code| {
            if !config.is_null() {
                // SAFETY: a readable CUlaunchConfig from the caller (checked non-null).
                let c = unsafe { &*config };
                // SAFETY: as `cluster_dims` (attrs checked there before any use).
                let dims = unsafe { cluster_dims(c) };
                tracing::debug!(code, grid = ?c.grid, block = ?c.block, shared = c.shared,
                    attributes = c.num_attrs, cluster = ?dims, "cuOccupancyMaxActiveClusters refused");
            }
        })?;
        tracing::trace!(clusters = n, "cuOccupancyMaxActiveClusters");
        // SAFETY: a writable int from the caller (NULL refused).
        unsafe { out(num, super::cluster_occupancy::as_int(n)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialClusterSize(
    size: *mut c_int,
    f: CUfunction,
    config: *const LaunchConfig,
) -> CUresult {
    guard("cuOccupancyMaxPotentialClusterSize", || {
        if config.is_null() {
            return Err(res::INVALID_VALUE);
        }
        // SAFETY: a readable CUlaunchConfig from the caller (checked non-null).
        let c = unsafe { &*config };
        let most = driver::with(|d| {
            super::cluster_occupancy::potential_cluster_size(d, f, c.block, u64::from(c.shared))
        })?
        .answer()?;
        // SAFETY: a writable int from the caller (NULL refused).
        unsafe { out(size, super::cluster_occupancy::as_int(most)) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(id: u32, words: &[u32]) -> LaunchAttribute {
        let mut value = [0u8; 64];
        for (i, w) in words.iter().enumerate() {
            value[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        LaunchAttribute {
            id,
            pad: [0; 4],
            value,
        }
    }

    #[test]
    fn attributes_the_launch_satisfies_pass_the_rest_are_refused() {
        assert_eq!(std::mem::size_of::<LaunchAttribute>(), 72);
        assert_eq!(check_attribute(&attr(id::PRIORITY, &[5])), Ok(()));
        assert_eq!(check_attribute(&attr(id::COOPERATIVE, &[0])), Ok(()));
        assert_eq!(
            check_attribute(&attr(id::COOPERATIVE, &[1])),
            Err(res::NOT_SUPPORTED)
        );
        assert_eq!(
            check_attribute(&attr(id::CLUSTER_DIMENSION, &[1, 1, 1])),
            Ok(())
        );
        // A cluster's size is checked with the launch, against what the vGPU runs.
        assert_eq!(
            check_attribute(&attr(id::CLUSTER_DIMENSION, &[2, 1, 1])),
            Ok(())
        );
        assert_eq!(
            check_attribute(&attr(id::LAUNCH_COMPLETION_EVENT, &[])),
            Err(res::NOT_SUPPORTED)
        );
        assert_eq!(check_attribute(&attr(999, &[])), Err(res::INVALID_VALUE));
    }
}
