//! Queries the CUDA runtime (libcudart) makes while it starts and on its common paths,
//! answered from what the library already knows: the module loading mode, a stream's
//! priority, id and device, the device's PCI bus id.

use std::ffi::{c_char, c_int, c_ulonglong};

use super::device::{attribute, check_dev};
use crate::driver;
use crate::types::{attr, res, CUdevice, CUresult, CUstream};
use crate::{guard, out};

/// `CU_MODULE_EAGER_LOADING`: a library's kernels are loaded with the library.
const CU_MODULE_EAGER_LOADING: c_int = 0x1;
/// `CU_MODULE_LAZY_LOADING`: a library loads on its first use (the default).
const CU_MODULE_LAZY_LOADING: c_int = 0x2;

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: *mut c_int) -> CUresult {
    guard("cuModuleGetLoadingMode", || {
        driver::with(|_| Ok(()))?;
        // SAFETY: a writable CUmoduleLoadingMode from the caller (NULL refused).
        unsafe {
            out(
                mode,
                if super::library::eager() {
                    CU_MODULE_EAGER_LOADING
                } else {
                    CU_MODULE_LAZY_LOADING
                },
            )
        }
    })
}

/// Checks `h` names the default stream or a live stream.
fn live_stream(h: CUstream) -> Result<(), CUresult> {
    driver::with(|d| {
        d.current_ctx()?;
        d.stream_queue(h as usize).map(drop)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetPriority(h: CUstream, priority: *mut c_int) -> CUresult {
    guard("cuStreamGetPriority", || {
        live_stream(h)?;
        // Every stream has the one priority the vGPU offers (cuCtxGetStreamPriorityRange).
        // SAFETY: a writable int from the caller (NULL refused).
        unsafe { out(priority, 0) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetId(h: CUstream, id: *mut c_ulonglong) -> CUresult {
    guard("cuStreamGetId", || {
        live_stream(h)?;
        // The handle is unique for the process's life (handles are never reused).
        // SAFETY: a writable unsigned long long from the caller (NULL refused).
        unsafe { out(id, h as c_ulonglong) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetDevice(h: CUstream, dev: *mut CUdevice) -> CUresult {
    guard("cuStreamGetDevice", || {
        live_stream(h)?;
        // SAFETY: a writable CUdevice from the caller (NULL refused).
        unsafe { out(dev, 0) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    bus_id: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    guard("cuDeviceGetPCIBusId", || {
        let text = driver::with(|d| {
            check_dev(dev)?;
            Ok(format!(
                "{:08X}:{:02X}:{:02X}.0",
                attribute(d, attr::PCI_DOMAIN_ID)?,
                attribute(d, attr::PCI_BUS_ID)?,
                attribute(d, attr::PCI_DEVICE_ID)?
            ))
        })?;
        if bus_id.is_null() || len <= 0 {
            return Err(res::INVALID_VALUE);
        }
        let bytes = text.as_bytes();
        let n = bytes.len().min(len as usize - 1);
        // SAFETY: the caller's buffer holds `len` bytes; we write n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), bus_id.cast::<u8>(), n);
            bus_id.add(n).write(0);
        }
        Ok(())
    })
}
