//! `cuPointerGetAttributes`: several attributes of one pointer at once, each answered as
//! `cuPointerGetAttribute` answers it. As with the driver, a pointer the library does
//! not know is no error: each attribute is written as zero (NULL).

use std::ffi::{c_int, c_uint, c_void};

use crate::driver;
use crate::guard;
use crate::types::{ptr_attr, res, CUdeviceptr, CUresult};

/// Bytes each attribute's value takes (as `cuPointerGetAttribute` writes it).
fn width(attribute: c_int) -> Option<usize> {
    Some(match attribute {
        ptr_attr::CONTEXT
        | ptr_attr::DEVICE_POINTER
        | ptr_attr::HOST_POINTER
        | ptr_attr::BUFFER_ID
        | ptr_attr::RANGE_START_ADDR
        | ptr_attr::RANGE_SIZE => 8,
        ptr_attr::MEMORY_TYPE
        | ptr_attr::IS_MANAGED
        | ptr_attr::DEVICE_ORDINAL
        | ptr_attr::MAPPED => 4,
        _ => return None,
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(
    num: c_uint,
    attributes: *const c_int,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    guard("cuPointerGetAttributes", || {
        if num == 0 || attributes.is_null() || data.is_null() {
            return Err(res::INVALID_VALUE);
        }
        // As the driver, with or without a current context (unified addressing).
        let known = driver::with(|d| {
            Ok(d.alloc_of(ptr).is_some()
                || d.host_of(ptr as usize).is_some()
                || d.registered_of(ptr as usize).is_some())
        })?;
        for i in 0..num as usize {
            // SAFETY: both arrays hold `num` entries (API contract).
            let (a, out) = unsafe { (*attributes.add(i), *data.add(i)) };
            if out.is_null() {
                return Err(res::INVALID_VALUE);
            }
            let w = width(a).ok_or_else(|| {
                crate::api::stubs::log_once("cuPointerGetAttributes (this attribute)");
                res::NOT_SUPPORTED
            })?;
            if !known {
                // SAFETY: `out` holds the attribute's value, `w` bytes (API contract).
                unsafe { std::ptr::write_bytes(out.cast::<u8>(), 0, w) };
                continue;
            }
            // SAFETY: as above; the single-attribute call writes the same type.
            match unsafe { super::memory::cuPointerGetAttribute(out, a, ptr) } {
                res::SUCCESS => {}
                // A device pointer has no host pointer and the other way round: NULL.
                res::INVALID_VALUE
                    if matches!(a, ptr_attr::DEVICE_POINTER | ptr_attr::HOST_POINTER) =>
                {
                    // SAFETY: as above.
                    unsafe { std::ptr::write_bytes(out.cast::<u8>(), 0, w) };
                }
                e => return Err(e),
            }
        }
        Ok(())
    })
}
