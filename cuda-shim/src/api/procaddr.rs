//! `cuGetProcAddress`: the entry point by base name (`cuMemAlloc` -> `cuMemAlloc_v2`), as
//! cuda-python and CUDA 12+ loaders resolve the driver API.

use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Mutex, OnceLock};

use super::{context::*, copy::*, device::*, launch::*, memory::*, module::*, stream::*};
use crate::types::{
    res, CUresult, CU_GET_PROC_ADDRESS_SUCCESS, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
};
use crate::{guard, out};

macro_rules! versions {
    ($($base:literal => [$($v:literal => $f:path),* $(,)?]),* $(,)?) => {
        vec![$($(($base, $v, $f as *const () as usize)),*),*]
    };
}

macro_rules! table {
    ($($base:literal => $f:path),* $(,)?) => {
        vec![$(($base, $f as *const () as usize)),*]
    };
}

/// (base name, function) for every implemented entry point, then every stub.
fn entries() -> &'static [(&'static str, usize)] {
    static TABLE: OnceLock<Vec<(&'static str, usize)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t: Vec<(&'static str, usize)> = table! {
            "cuInit" => cuInit,
            "cuDriverGetVersion" => cuDriverGetVersion,
            "cuGetErrorName" => cuGetErrorName,
            "cuGetErrorString" => cuGetErrorString,
            "cuDeviceGetCount" => cuDeviceGetCount,
            "cuDeviceGet" => cuDeviceGet,
            "cuDeviceGetName" => cuDeviceGetName,
            "cuDeviceGetUuid" => cuDeviceGetUuid_v2,
            "cuDeviceTotalMem" => cuDeviceTotalMem_v2,
            "cuDeviceComputeCapability" => cuDeviceComputeCapability,
            "cuDeviceGetAttribute" => cuDeviceGetAttribute,
            "cuDeviceCanAccessPeer" => cuDeviceCanAccessPeer,
            "cuDevicePrimaryCtxRetain" => cuDevicePrimaryCtxRetain,
            "cuDevicePrimaryCtxRelease" => cuDevicePrimaryCtxRelease_v2,
            "cuDevicePrimaryCtxReset" => cuDevicePrimaryCtxReset_v2,
            "cuDevicePrimaryCtxGetState" => cuDevicePrimaryCtxGetState,
            "cuDevicePrimaryCtxSetFlags" => cuDevicePrimaryCtxSetFlags_v2,
            "cuCtxDestroy" => cuCtxDestroy_v2,
            "cuCtxSetCurrent" => cuCtxSetCurrent,
            "cuCtxGetCurrent" => cuCtxGetCurrent,
            "cuCtxPushCurrent" => cuCtxPushCurrent_v2,
            "cuCtxPopCurrent" => cuCtxPopCurrent_v2,
            "cuCtxSynchronize" => cuCtxSynchronize,
            "cuCtxGetDevice" => cuCtxGetDevice,
            "cuCtxGetApiVersion" => cuCtxGetApiVersion,
            "cuCtxGetFlags" => cuCtxGetFlags,
            "cuCtxGetId" => cuCtxGetId,
            "cuCtxGetStreamPriorityRange" => cuCtxGetStreamPriorityRange,
            "cuMemAlloc" => cuMemAlloc_v2,
            "cuMemFree" => cuMemFree_v2,
            "cuMemGetInfo" => cuMemGetInfo_v2,
            "cuMemAllocHost" => cuMemAllocHost_v2,
            "cuMemHostAlloc" => cuMemHostAlloc,
            "cuMemFreeHost" => cuMemFreeHost,
            "cuMemHostGetFlags" => cuMemHostGetFlags,
            "cuMemHostRegister" => cuMemHostRegister_v2,
            "cuMemHostUnregister" => cuMemHostUnregister,
            "cuMemHostGetDevicePointer" => cuMemHostGetDevicePointer_v2,
            "cuMemGetAddressRange" => cuMemGetAddressRange_v2,
            "cuPointerGetAttribute" => cuPointerGetAttribute,
            "cuMemcpyHtoD" => cuMemcpyHtoD_v2,
            "cuMemcpyHtoDAsync" => cuMemcpyHtoDAsync_v2,
            "cuMemcpyDtoH" => cuMemcpyDtoH_v2,
            "cuMemcpyDtoHAsync" => cuMemcpyDtoHAsync_v2,
            "cuMemcpyDtoD" => cuMemcpyDtoD_v2,
            "cuMemcpyDtoDAsync" => cuMemcpyDtoDAsync_v2,
            "cuMemsetD8" => cuMemsetD8_v2,
            "cuMemsetD16" => cuMemsetD16_v2,
            "cuMemsetD32" => cuMemsetD32_v2,
            "cuMemsetD8Async" => cuMemsetD8Async,
            "cuMemsetD16Async" => cuMemsetD16Async,
            "cuMemsetD32Async" => cuMemsetD32Async,
            "cuModuleLoad" => cuModuleLoad,
            "cuModuleLoadData" => cuModuleLoadData,
            "cuModuleLoadDataEx" => cuModuleLoadDataEx,
            "cuModuleUnload" => cuModuleUnload,
            "cuModuleGetFunction" => cuModuleGetFunction,
            "cuModuleGetGlobal" => cuModuleGetGlobal_v2,
            "cuFuncGetAttribute" => cuFuncGetAttribute,
            "cuLaunchKernel" => cuLaunchKernel,
            "cuStreamCreate" => cuStreamCreate,
            "cuStreamCreateWithPriority" => cuStreamCreateWithPriority,
            "cuStreamDestroy" => cuStreamDestroy_v2,
            "cuStreamSynchronize" => cuStreamSynchronize,
            "cuStreamQuery" => cuStreamQuery,
            "cuStreamGetFlags" => cuStreamGetFlags,
            "cuStreamGetCtx" => cuStreamGetCtx,
            "cuStreamGetGreenCtx" => cuStreamGetGreenCtx,
            "cuStreamWaitEvent" => cuStreamWaitEvent,
            "cuEventCreate" => cuEventCreate,
            "cuEventRecord" => cuEventRecord,
            "cuEventRecordWithFlags" => cuEventRecordWithFlags,
            "cuEventQuery" => cuEventQuery,
            "cuEventSynchronize" => cuEventSynchronize,
            "cuEventElapsedTime" => cuEventElapsedTime,
            "cuEventDestroy" => cuEventDestroy_v2,
            "cuGetProcAddress" => cuGetProcAddress_v2,
            "cuGetExportTable" => super::export::cuGetExportTable,
            "cuModuleGetLoadingMode" => super::runtime::cuModuleGetLoadingMode,
            "cuStreamGetPriority" => super::runtime::cuStreamGetPriority,
            "cuStreamGetId" => super::runtime::cuStreamGetId,
            "cuStreamGetDevice" => super::runtime::cuStreamGetDevice,
            "cuDeviceGetPCIBusId" => super::runtime::cuDeviceGetPCIBusId,
        };
        for (name, f) in super::stubs::STUBS {
            let base = name.strip_suffix("_v2").unwrap_or(name);
            t.push((base, *f as *const () as usize));
        }
        t.extend(super::ext_table::entries());
        t
    })
}

/// `CU_GET_PROC_ADDRESS_*` flags.
const FLAG_LEGACY_STREAM: u64 = 1 << 0;
const FLAG_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

/// Base names whose function depends on the CUDA version asked for, as the real driver
/// resolves them: (base, from version, function), newest first within a base.
fn versioned() -> &'static [(&'static str, c_int, usize)] {
    static TABLE: OnceLock<Vec<(&'static str, c_int, usize)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = versions! {
            "cuCtxCreate" => [12050 => cuCtxCreate_v4, 11040 => cuCtxCreate_v3, 3020 => cuCtxCreate_v2],
            "cuGetProcAddress" => [12000 => cuGetProcAddress_v2, 11030 => cuGetProcAddress],
            "cuStreamGetCtx" => [12050 => super::ptsz::cuStreamGetCtx_v2, 9020 => cuStreamGetCtx],
            "cuEventElapsedTime" => [12080 => cuEventElapsedTime_v2, 2000 => cuEventElapsedTime],
            "cuDeviceGetUuid" => [11040 => cuDeviceGetUuid_v2, 9020 => cuDeviceGetUuid],
            "cuDevicePrimaryCtxRelease" => [11000 => cuDevicePrimaryCtxRelease_v2, 7000 => cuDevicePrimaryCtxRelease],
            "cuDevicePrimaryCtxReset" => [11000 => cuDevicePrimaryCtxReset_v2, 7000 => cuDevicePrimaryCtxReset],
            "cuDevicePrimaryCtxSetFlags" => [11000 => cuDevicePrimaryCtxSetFlags_v2, 7000 => cuDevicePrimaryCtxSetFlags],
            "cuCtxDestroy" => [4000 => cuCtxDestroy_v2, 2000 => cuCtxDestroy],
            "cuCtxPushCurrent" => [4000 => cuCtxPushCurrent_v2, 2000 => cuCtxPushCurrent],
            "cuCtxPopCurrent" => [4000 => cuCtxPopCurrent_v2, 2000 => cuCtxPopCurrent],
            "cuStreamDestroy" => [4000 => cuStreamDestroy_v2, 2000 => cuStreamDestroy],
            "cuEventDestroy" => [4000 => cuEventDestroy_v2, 2000 => cuEventDestroy],
            "cuMemHostRegister" => [6050 => cuMemHostRegister_v2, 4000 => cuMemHostRegister],
        };
        t.extend(super::ext_table::versioned());
        t
    })
}

/// The per-thread default stream variants (`CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`):
/// (base, from version, function), newest first within a base. Base names not listed
/// have no such variant and resolve as without the flag.
fn per_thread() -> &'static [(&'static str, c_int, usize)] {
    use super::ptsz::*;
    static TABLE: OnceLock<Vec<(&'static str, c_int, usize)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        versions! {
            "cuMemcpyHtoD" => [7000 => cuMemcpyHtoD_v2_ptds],
            "cuMemcpyDtoH" => [7000 => cuMemcpyDtoH_v2_ptds],
            "cuMemcpyDtoD" => [7000 => cuMemcpyDtoD_v2_ptds],
            "cuMemsetD8" => [7000 => cuMemsetD8_v2_ptds],
            "cuMemsetD16" => [7000 => cuMemsetD16_v2_ptds],
            "cuMemsetD32" => [7000 => cuMemsetD32_v2_ptds],
            "cuMemcpyHtoDAsync" => [7000 => cuMemcpyHtoDAsync_v2_ptsz],
            "cuMemcpyDtoHAsync" => [7000 => cuMemcpyDtoHAsync_v2_ptsz],
            "cuMemcpyDtoDAsync" => [7000 => cuMemcpyDtoDAsync_v2_ptsz],
            "cuMemsetD8Async" => [7000 => cuMemsetD8Async_ptsz],
            "cuMemsetD16Async" => [7000 => cuMemsetD16Async_ptsz],
            "cuMemsetD32Async" => [7000 => cuMemsetD32Async_ptsz],
            "cuLaunchKernel" => [7000 => cuLaunchKernel_ptsz],
            "cuStreamSynchronize" => [7000 => cuStreamSynchronize_ptsz],
            "cuStreamQuery" => [7000 => cuStreamQuery_ptsz],
            "cuStreamGetFlags" => [7000 => cuStreamGetFlags_ptsz],
            "cuStreamGetPriority" => [7000 => cuStreamGetPriority_ptsz],
            "cuStreamGetId" => [12000 => cuStreamGetId_ptsz],
            "cuStreamGetDevice" => [12080 => cuStreamGetDevice_ptsz],
            "cuStreamGetCtx" => [12050 => cuStreamGetCtx_v2_ptsz, 9020 => cuStreamGetCtx_ptsz],
            "cuStreamWaitEvent" => [7000 => cuStreamWaitEvent_ptsz],
            "cuEventRecord" => [7000 => cuEventRecord_ptsz],
            "cuEventRecordWithFlags" => [11010 => cuEventRecordWithFlags_ptsz],
        }
    })
}

/// The CUDA version that introduced each base name's current function, for names newer
/// than CUDA 2.0 (asked for with an older version: `VERSION_NOT_SUFFICIENT`).
const INTRODUCED: &[(&str, c_int)] = &[
    ("cuDriverGetVersion", 2020),
    ("cuGetErrorName", 6000),
    ("cuGetErrorString", 6000),
    ("cuDeviceTotalMem", 3020),
    ("cuDeviceCanAccessPeer", 4000),
    ("cuDevicePrimaryCtxRetain", 7000),
    ("cuDevicePrimaryCtxGetState", 7000),
    ("cuCtxSetCurrent", 4000),
    ("cuCtxGetCurrent", 4000),
    ("cuCtxGetApiVersion", 3020),
    ("cuCtxGetFlags", 7000),
    ("cuCtxGetId", 12000),
    ("cuCtxGetStreamPriorityRange", 5050),
    ("cuMemAlloc", 3020),
    ("cuMemFree", 3020),
    ("cuMemGetInfo", 3020),
    ("cuMemAllocHost", 3020),
    ("cuMemHostAlloc", 2020),
    ("cuMemHostGetFlags", 2030),
    ("cuMemHostUnregister", 4000),
    ("cuMemHostGetDevicePointer", 3020),
    ("cuMemGetAddressRange", 3020),
    ("cuPointerGetAttribute", 4000),
    ("cuMemcpyHtoD", 3020),
    ("cuMemcpyHtoDAsync", 3020),
    ("cuMemcpyDtoH", 3020),
    ("cuMemcpyDtoHAsync", 3020),
    ("cuMemcpyDtoD", 3020),
    ("cuMemcpyDtoDAsync", 3020),
    ("cuMemsetD8", 3020),
    ("cuMemsetD16", 3020),
    ("cuMemsetD32", 3020),
    ("cuMemsetD8Async", 3020),
    ("cuMemsetD16Async", 3020),
    ("cuMemsetD32Async", 3020),
    ("cuModuleLoadDataEx", 2010),
    ("cuModuleGetGlobal", 3020),
    ("cuFuncGetAttribute", 2020),
    ("cuLaunchKernel", 4000),
    ("cuStreamCreateWithPriority", 5050),
    ("cuStreamGetFlags", 5050),
    ("cuStreamWaitEvent", 3020),
    ("cuEventRecordWithFlags", 11010),
    ("cuGetExportTable", 3000),
    ("cuModuleGetLoadingMode", 11070),
    ("cuStreamGetPriority", 5050),
    ("cuStreamGetId", 12000),
    ("cuStreamGetDevice", 12080),
    ("cuDeviceGetPCIBusId", 4010),
];

/// What `cuGetProcAddress` finds for a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    Function(usize),
    /// The name exists from a later CUDA version than the one asked for.
    VersionNotSufficient,
    NotFound,
}

fn pick(table: &[(&str, c_int, usize)], symbol: &str, version: c_int) -> Option<Found> {
    let mut known = false;
    for &(name, from, f) in table {
        if name == symbol {
            known = true;
            if version >= from {
                return Some(Found::Function(f));
            }
        }
    }
    known.then_some(Found::VersionNotSufficient)
}

/// The function for `symbol` at CUDA version `version` with `cuGetProcAddress`'s `flags`.
pub fn lookup(symbol: &str, version: c_int, flags: u64) -> Found {
    if flags & FLAG_PER_THREAD_DEFAULT_STREAM != 0 {
        if let Some(found) = pick(per_thread(), symbol, version) {
            return found;
        }
    }
    if let Some(found) = pick(versioned(), symbol, version) {
        return found;
    }
    let Some(&(_, f)) = entries().iter().find(|(name, _)| *name == symbol) else {
        return Found::NotFound;
    };
    let introduced = INTRODUCED
        .iter()
        .chain(super::ext_table::INTRODUCED)
        .find(|(name, _)| *name == symbol)
        .map_or(0, |&(_, v)| v);
    if version < introduced {
        Found::VersionNotSufficient
    } else {
        Found::Function(f)
    }
}

/// Names asked for that this library does not have, logged once each.
fn log_missing(name: &str, version: c_int, flags: u64) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen
        .get_or_insert_with(HashSet::new)
        .insert(name.to_string())
    {
        tracing::info!(
            symbol = name,
            version,
            flags,
            "cuGetProcAddress: no such entry point on a vGPU"
        );
    }
}

unsafe fn resolve(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> Result<Found, CUresult> {
    if symbol.is_null() || pfn.is_null() {
        return Err(res::INVALID_VALUE);
    }
    if flags & !(FLAG_LEGACY_STREAM | FLAG_PER_THREAD_DEFAULT_STREAM) != 0 {
        return Err(res::INVALID_VALUE);
    }
    // SAFETY: a NUL-terminated symbol name from the caller.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    let found = lookup(name, version, flags);
    let f = match found {
        Found::Function(f) => f as *mut c_void,
        _ => std::ptr::null_mut(),
    };
    // SAFETY: checked non-null; a writable `void*` from the caller.
    unsafe { out(pfn, f)? };
    match found {
        Found::Function(_) => tracing::trace!(symbol = name, version, flags, "cuGetProcAddress"),
        Found::NotFound => log_missing(name, version, flags),
        Found::VersionNotSufficient => tracing::debug!(
            symbol = name,
            version,
            "cuGetProcAddress: the entry point is newer than the version asked for"
        ),
    }
    Ok(found)
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    guard("cuGetProcAddress", || {
        // SAFETY: the caller's pointers, checked inside.
        match unsafe { resolve(symbol, pfn, version, flags)? } {
            Found::Function(_) => Ok(()),
            _ => Err(res::NOT_FOUND),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    guard("cuGetProcAddress_v2", || {
        // SAFETY: the caller's pointers, checked inside.
        let found = unsafe { resolve(symbol, pfn, version, flags)? };
        if !status.is_null() {
            let s = match found {
                Found::Function(_) => CU_GET_PROC_ADDRESS_SUCCESS,
                Found::NotFound => CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
                Found::VersionNotSufficient => CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
            };
            // SAFETY: non-null; a writable status from the caller.
            unsafe { out(status, s)? };
            // With a status to report it in, a missing symbol is no error: the driver
            // answers CUDA_SUCCESS and the status says what was found.
            return Ok(());
        }
        match found {
            Found::Function(_) => Ok(()),
            _ => Err(res::NOT_FOUND),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(p: *const ()) -> Found {
        Found::Function(p as usize)
    }

    #[test]
    fn capture_and_graph_names_resolve_by_version() {
        use super::super::capture::*;
        use super::super::graph::*;
        let capture_info = [
            (13000, cuStreamGetCaptureInfo_v3 as *const ()),
            (12030, cuStreamGetCaptureInfo_v3 as *const ()),
            (12020, cuStreamGetCaptureInfo_v2 as *const ()),
            (11030, cuStreamGetCaptureInfo_v2 as *const ()),
            (10010, cuStreamGetCaptureInfo as *const ()),
        ];
        for (version, want) in capture_info {
            assert_eq!(
                lookup("cuStreamGetCaptureInfo", version, 0),
                f(want),
                "{version}"
            );
        }
        assert_eq!(
            lookup("cuStreamGetCaptureInfo", 10000, 0),
            Found::VersionNotSufficient
        );
        assert_eq!(
            lookup("cuGraphInstantiate", 12000, 0),
            f(cuGraphInstantiateWithFlags as *const ())
        );
        assert_eq!(
            lookup("cuGraphInstantiate", 11080, 0),
            f(cuGraphInstantiate_v2 as *const ())
        );
        assert_eq!(
            lookup("cuGraphAddKernelNode", 12000, 0),
            f(cuGraphAddKernelNode_v2 as *const ())
        );
        assert_eq!(
            lookup("cuGraphAddKernelNode", 11080, 0),
            f(cuGraphAddKernelNode as *const ())
        );
        assert_eq!(
            lookup("cuStreamBeginCapture", 10010, 0),
            f(cuStreamBeginCapture_v2 as *const ())
        );
        assert_eq!(
            lookup("cuStreamBeginCapture", 10000, 0),
            f(cuStreamBeginCapture as *const ())
        );
        // Names of the library API and later areas exist from the version that added them.
        assert_eq!(
            lookup("cuLibraryLoadData", 11080, 0),
            Found::VersionNotSufficient
        );
        assert_eq!(
            lookup("cuLibraryLoadData", 12000, 0),
            f(super::super::library::cuLibraryLoadData as *const ())
        );
        assert_eq!(
            lookup("cuKernelGetLibrary", 12040, 0),
            Found::VersionNotSufficient
        );
        assert_eq!(
            lookup("cuMemAllocAsync", 11010, 0),
            Found::VersionNotSufficient
        );
        assert_eq!(
            lookup("cuGraphUpload", 11000, 0),
            Found::VersionNotSufficient
        );
    }

    #[test]
    fn versions_and_flags_pick_the_drivers_variant() {
        assert_eq!(
            lookup("cuCtxCreate", 13000, 0),
            f(cuCtxCreate_v4 as *const ())
        );
        assert_eq!(
            lookup("cuCtxCreate", 12000, 0),
            f(cuCtxCreate_v3 as *const ())
        );
        assert_eq!(
            lookup("cuCtxCreate", 11000, 0),
            f(cuCtxCreate_v2 as *const ())
        );
        assert_eq!(lookup("cuCtxCreate", 3000, 0), Found::VersionNotSufficient);
        assert_eq!(lookup("cuCtxGetId", 11080, 0), Found::VersionNotSufficient);
        assert_eq!(lookup("cuCtxGetId", 12000, 0), f(cuCtxGetId as *const ()));
        assert_eq!(
            lookup("cuLaunchKernel", 13000, FLAG_PER_THREAD_DEFAULT_STREAM),
            f(super::super::ptsz::cuLaunchKernel_ptsz as *const ())
        );
        assert_eq!(
            lookup("cuLaunchKernel", 13000, FLAG_LEGACY_STREAM),
            f(cuLaunchKernel as *const ())
        );
        // No per-thread variant: the function itself.
        assert_eq!(
            lookup("cuMemAlloc", 13000, FLAG_PER_THREAD_DEFAULT_STREAM),
            f(cuMemAlloc_v2 as *const ())
        );
        assert_eq!(
            lookup("cuStreamGetCtx", 12050, 0),
            f(super::super::ptsz::cuStreamGetCtx_v2 as *const ())
        );
        assert_eq!(
            lookup("cuStreamGetCtx", 12000, 0),
            f(cuStreamGetCtx as *const ())
        );
        assert_eq!(lookup("cuNoSuchFunction", 13000, 0), Found::NotFound);
    }
}
