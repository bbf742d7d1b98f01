//! Initialisation, shutdown, error texts and the system's versions.
//!
//! The exported functions' contract is NVML's: every pointer a program passes must be
//! valid for what NVML documents (the library checks NULL and the device handle, and cannot
//! check more than that, exactly like NVIDIA's).
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint};

use crate::types::{error_text, ret, NvmlReturn};
use crate::{cuda, guard, inits, out, out_text};

/// The NVIDIA driver branch whose CUDA version (13.0) the vGPU CUDA library speaks; there
/// is no NVIDIA driver in a tenant, so this is what `nvmlSystemGetDriverVersion` reports.
pub const DRIVER_VERSION: &str = "580.0.0";
/// What `nvmlSystemGetCudaDriverVersion` answers before the CUDA library is loaded: the
/// version `cuDriverGetVersion` of the vGPU CUDA library answers.
pub const CUDA_VERSION: c_int = 13000;

/// `nvmlInit`: counts one more user once a vGPU is configured; does not connect.
fn init() -> Result<(), NvmlReturn> {
    let mut n = inits();
    if *n > 0 {
        *n = n.saturating_add(1);
        return Ok(());
    }
    let c = cuda::load().map_err(|why| {
        tracing::warn!("NVML: no vGPU driver: {why}; answering NVML_ERROR_DRIVER_NOT_LOADED");
        ret::DRIVER_NOT_LOADED
    })?;
    if let Err(why) = c.probe() {
        tracing::warn!("NVML: no vGPU: {why}; answering NVML_ERROR_DRIVER_NOT_LOADED");
        return Err(ret::DRIVER_NOT_LOADED);
    }
    tracing::info!(
        library = c.path,
        "NVML: the vGPU is reached through the vGPU CUDA library"
    );
    *n = 1;
    Ok(())
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    guard("nvmlInit_v2", init)
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> NvmlReturn {
    guard("nvmlInit", init)
}

/// Every flag (`NVML_INIT_FLAG_NO_GPUS`, `NO_ATTACH`, `FORCE_INIT`) is accepted: the vGPU
/// is configured or it is not, and nothing is attached before a query needs it.
#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    guard("nvmlInitWithFlags", init)
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    guard("nvmlShutdown", || {
        let mut n = inits();
        if *n == 0 {
            return Err(ret::UNINITIALIZED);
        }
        *n -= 1;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    error_text(result).as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    guard("nvmlSystemGetDriverVersion", || {
        crate::initialised()?;
        // SAFETY: `version` is NULL (refused) or holds `length` bytes.
        unsafe { out_text(version, length, DRIVER_VERSION) }
    })
}

/// The CUDA version: the CUDA library's when loaded, else the one it answers.
fn cuda_version() -> Result<c_int, NvmlReturn> {
    match cuda::loaded() {
        Some(c) => c.cuda_version(),
        None => Ok(CUDA_VERSION),
    }
}

/// NVML's version: the CUDA major version, then the driver's.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    guard("nvmlSystemGetNVMLVersion", || {
        let text = format!("{}.{DRIVER_VERSION}", cuda_version()? / 1000);
        // SAFETY: `version` is NULL (refused) or holds `length` bytes.
        unsafe { out_text(version, length, &text) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> NvmlReturn {
    guard("nvmlSystemGetCudaDriverVersion", || {
        let v = cuda_version()?;
        // SAFETY: a writable int from the caller (NULL refused).
        unsafe { out(version, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> NvmlReturn {
    // SAFETY: same contract.
    unsafe { nvmlSystemGetCudaDriverVersion(version) }
}
