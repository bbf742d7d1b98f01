//! Entry points for the vGPU's NVML library (`vgpu-nvml`, installed beside this library as
//! `libnvidia-ml.so.1`, docs/nvml.md). A process vGPU's worker serves one connection, so
//! the NVML library cannot open a second one: it reaches the vGPU through this library's,
//! by these functions and the ordinary driver API. They are not part of the CUDA API and
//! `cuGetProcAddress` does not list them.

use std::ffi::{c_char, c_int};

use crate::driver;
use crate::types::{res, CUresult};
use crate::{guard, out};

/// Copies `text` into the caller's buffer of `len` bytes, truncated and NUL-terminated.
///
/// # Safety
/// `buf` must be NULL or valid for writes of `len` bytes.
unsafe fn write_text(buf: *mut c_char, len: usize, text: &str) {
    if buf.is_null() || len == 0 {
        return;
    }
    let bytes = text.as_bytes();
    let n = bytes.len().min(len - 1);
    // SAFETY: the caller's buffer holds `len` bytes; we write n + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), n);
        buf.add(n).write(0);
    }
}

/// Whether this process has a vGPU, without connecting to it: `CUDA_SUCCESS` when the
/// library is open, or when the environment names a vGPU (`VGPU_SOCKET`, or a VM's vGPU on
/// the kernel command line) and `cuInit` was not called yet; otherwise
/// `CUDA_ERROR_NO_DEVICE`, with the reason (what `cuInit` logs) in `why` (up to `len` bytes
/// with the NUL; `why` may be NULL).
#[no_mangle]
pub unsafe extern "C" fn vgpuCudaProbe(why: *mut c_char, len: usize) -> CUresult {
    guard("vgpuCudaProbe", || {
        let reason = match driver::init_state() {
            Some((res::SUCCESS, _)) => return Ok(()),
            Some((code, reason)) => {
                let text = reason.unwrap_or("cuInit found no vGPU");
                // SAFETY: `why` is NULL or holds `len` bytes (the caller's contract).
                unsafe { write_text(why, len, text) };
                return Err(code);
            }
            None => match crate::transport::configured() {
                Ok(()) => return Ok(()),
                Err(e) => e.to_string(),
            },
        };
        // SAFETY: as above.
        unsafe { write_text(why, len, &reason) };
        Err(res::NO_DEVICE)
    })
}

/// The vGPU's memory now, as its device reports it (`GET_INFO`, queued behind the work
/// already on the default stream, as `cuMemGetInfo` is): `share` the bytes it may allocate,
/// `used` the bytes it has allocated; `holds` 1 when this process holds a context on it (the
/// primary context retained, or one it created), else 0. No context is needed.
/// `CUDA_ERROR_NOT_INITIALIZED` before `cuInit`; `CUDA_ERROR_DEVICE_UNAVAILABLE` once the
/// worker is gone.
#[no_mangle]
pub unsafe extern "C" fn vgpuCudaMemory(
    share: *mut u64,
    used: *mut u64,
    holds: *mut c_int,
) -> CUresult {
    guard("vgpuCudaMemory", || {
        let (info, held) = driver::with(|d| {
            let held = d.primary_refs > 0 || d.contexts.values().any(|c| !c.primary);
            let t = d.t.clone();
            let info = d.queue(0)?.call(&t, |s| s.get_info())?;
            Ok((info, held))
        })?;
        if share.is_null() || used.is_null() || holds.is_null() {
            return Err(res::INVALID_VALUE);
        }
        // SAFETY: all three checked non-null; writable from the caller.
        unsafe {
            out(share, info.memory_share)?;
            out(used, info.memory_used)?;
            out(holds, c_int::from(held))
        }
    })
}
