//! `cuGetProcAddress`: the entry point by base name (`cuMemAlloc` -> `cuMemAlloc_v2`), as
//! cuda-python and CUDA 12+ loaders resolve the driver API.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use super::{context::*, copy::*, device::*, launch::*, memory::*, module::*, stream::*};
use crate::types::{
    res, CUresult, CU_GET_PROC_ADDRESS_SUCCESS, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
};
use crate::{guard, out};

/// The CUDA version from which `cuCtxCreate` means `cuCtxCreate_v4`.
const CTX_CREATE_V4_FROM: c_int = 13000;

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
        t
    })
}

/// The function for `symbol` at CUDA version `version`, if this library has it.
pub fn lookup(symbol: &str, version: c_int) -> Option<usize> {
    match symbol {
        "cuCtxCreate" if version >= CTX_CREATE_V4_FROM => {
            return Some(cuCtxCreate_v4 as *const () as usize)
        }
        "cuCtxCreate" => return Some(cuCtxCreate_v2 as *const () as usize),
        "cuGetProcAddress" if version < 12000 => {
            return Some(cuGetProcAddress as *const () as usize)
        }
        _ => {}
    }
    entries()
        .iter()
        .find(|(name, _)| *name == symbol)
        .map(|&(_, f)| f)
}

unsafe fn resolve(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
) -> Result<bool, CUresult> {
    if symbol.is_null() || pfn.is_null() {
        return Err(res::INVALID_VALUE);
    }
    // SAFETY: a NUL-terminated symbol name from the caller.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    let found = lookup(name, version);
    // SAFETY: checked non-null; a writable `void*` from the caller.
    unsafe {
        out(
            pfn,
            found.map_or(std::ptr::null_mut(), |f| f as *mut c_void),
        )?
    };
    if found.is_none() {
        tracing::debug!(
            symbol = name,
            version,
            "cuGetProcAddress: no such entry point"
        );
    }
    Ok(found.is_some())
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    _flags: u64,
) -> CUresult {
    guard("cuGetProcAddress", || {
        // SAFETY: the caller's pointers, checked inside.
        match unsafe { resolve(symbol, pfn, version)? } {
            true => Ok(()),
            false => Err(res::NOT_FOUND),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    _flags: u64,
    status: *mut c_int,
) -> CUresult {
    guard("cuGetProcAddress_v2", || {
        // SAFETY: the caller's pointers, checked inside.
        let found = unsafe { resolve(symbol, pfn, version)? };
        if !status.is_null() {
            let s = if found {
                CU_GET_PROC_ADDRESS_SUCCESS
            } else {
                CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
            };
            // SAFETY: non-null; a writable status from the caller.
            unsafe { out(status, s)? };
        }
        match found {
            true => Ok(()),
            false => Err(res::NOT_FOUND),
        }
    })
}
