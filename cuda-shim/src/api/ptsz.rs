//! The per-thread default stream variants (`_ptsz`: functions taking a stream; `_ptds`:
//! synchronous functions on the default stream), exported under the real libcuda's names
//! and returned by `cuGetProcAddress` with `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
//! Programs built with `--default-stream per-thread` (or `CUDA_API_PER_THREAD_DEFAULT_STREAM`)
//! and the runtime's `cudaStreamPerThread` reach them.
//!
//! A `_ptsz` call with stream 0 uses the calling thread's default stream
//! (`CU_STREAM_PER_THREAD`): like every default stream it runs on queue 0, without the
//! legacy stream's implicit waits for the other streams. A `_ptds` call behaves as the
//! legacy one: its implicit ordering is stricter than CUDA requires, never looser.
//! Also here: the CUDA 13 variants that take an explicit context
//! (`cuCtxSynchronize_v2`, `cuCtxGetDevice_v2`) or report a green context
//! (`cuStreamGetCtx_v2`).

use std::ffi::{c_int, c_uchar, c_uint, c_ulonglong, c_ushort, c_void};

use super::{context::*, copy::*, launch::*, runtime::*, stream::*};
use crate::driver;
use crate::types::{
    res, CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUresult, CUstream,
};
use crate::{guard, out};

/// The stream a `_ptsz` call means: NULL is the calling thread's default stream.
fn per_thread(s: CUstream) -> CUstream {
    if s.is_null() {
        crate::types::CU_STREAM_PER_THREAD as CUstream
    } else {
        s
    }
}

#[no_mangle]
pub extern "C" fn cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult {
    cuMemcpyHtoD_v2(dst, src, n)
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    cuMemcpyDtoH_v2(dst, src, n)
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    cuMemcpyDtoD_v2(dst, src, n)
}

#[no_mangle]
pub extern "C" fn cuMemsetD8_v2_ptds(dst: CUdeviceptr, v: c_uchar, n: usize) -> CUresult {
    cuMemsetD8_v2(dst, v, n)
}

#[no_mangle]
pub extern "C" fn cuMemsetD16_v2_ptds(dst: CUdeviceptr, v: c_ushort, n: usize) -> CUresult {
    cuMemsetD16_v2(dst, v, n)
}

#[no_mangle]
pub extern "C" fn cuMemsetD32_v2_ptds(dst: CUdeviceptr, v: c_uint, n: usize) -> CUresult {
    cuMemsetD32_v2(dst, v, n)
}

#[no_mangle]
pub extern "C" fn cuMemcpyHtoDAsync_v2_ptsz(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    s: CUstream,
) -> CUresult {
    cuMemcpyHtoDAsync_v2(dst, src, n, per_thread(s))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoHAsync_v2_ptsz(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    cuMemcpyDtoHAsync_v2(dst, src, n, per_thread(s))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2_ptsz(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    cuMemcpyDtoDAsync_v2(dst, src, n, per_thread(s))
}

#[no_mangle]
pub extern "C" fn cuMemsetD8Async_ptsz(
    dst: CUdeviceptr,
    v: c_uchar,
    n: usize,
    s: CUstream,
) -> CUresult {
    cuMemsetD8Async(dst, v, n, per_thread(s))
}

#[no_mangle]
pub extern "C" fn cuMemsetD16Async_ptsz(
    dst: CUdeviceptr,
    v: c_ushort,
    n: usize,
    s: CUstream,
) -> CUresult {
    cuMemsetD16Async(dst, v, n, per_thread(s))
}

#[no_mangle]
pub extern "C" fn cuMemsetD32Async_ptsz(
    dst: CUdeviceptr,
    v: c_uint,
    n: usize,
    s: CUstream,
) -> CUresult {
    cuMemsetD32Async(dst, v, n, per_thread(s))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    s: CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: cuLaunchKernel's contract.
    unsafe {
        cuLaunchKernel(
            f,
            gx,
            gy,
            gz,
            bx,
            by,
            bz,
            shared,
            per_thread(s),
            kernel_params,
            extra,
        )
    }
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize_ptsz(s: CUstream) -> CUresult {
    cuStreamSynchronize(per_thread(s))
}

#[no_mangle]
pub extern "C" fn cuStreamQuery_ptsz(s: CUstream) -> CUresult {
    cuStreamQuery(per_thread(s))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags_ptsz(s: CUstream, flags: *mut c_uint) -> CUresult {
    // SAFETY: cuStreamGetFlags's contract.
    unsafe { cuStreamGetFlags(per_thread(s), flags) }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetPriority_ptsz(s: CUstream, priority: *mut c_int) -> CUresult {
    // SAFETY: cuStreamGetPriority's contract.
    unsafe { cuStreamGetPriority(per_thread(s), priority) }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetId_ptsz(s: CUstream, id: *mut c_ulonglong) -> CUresult {
    // SAFETY: cuStreamGetId's contract.
    unsafe { cuStreamGetId(per_thread(s), id) }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetDevice_ptsz(s: CUstream, dev: *mut CUdevice) -> CUresult {
    // SAFETY: cuStreamGetDevice's contract.
    unsafe { cuStreamGetDevice(per_thread(s), dev) }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx_ptsz(s: CUstream, pctx: *mut CUcontext) -> CUresult {
    // SAFETY: cuStreamGetCtx's contract.
    unsafe { cuStreamGetCtx(per_thread(s), pctx) }
}

/// `cuStreamGetCtx_v2`: the stream's context, and its green context (never one here).
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx_v2(
    s: CUstream,
    pctx: *mut CUcontext,
    pgreen: *mut *mut c_void,
) -> CUresult {
    guard("cuStreamGetCtx_v2", || {
        if pctx.is_null() && pgreen.is_null() {
            return Err(res::INVALID_VALUE);
        }
        if !pgreen.is_null() {
            // SAFETY: non-null, a writable CUgreenCtx from the caller.
            unsafe { out(pgreen, std::ptr::null_mut())? };
        }
        if !pctx.is_null() {
            // SAFETY: cuStreamGetCtx's contract, pctx checked non-null.
            match unsafe { cuStreamGetCtx(s, pctx) } {
                res::SUCCESS => {}
                e => return Err(e),
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx_v2_ptsz(
    s: CUstream,
    pctx: *mut CUcontext,
    pgreen: *mut *mut c_void,
) -> CUresult {
    // SAFETY: cuStreamGetCtx_v2's contract.
    unsafe { cuStreamGetCtx_v2(per_thread(s), pctx, pgreen) }
}

#[no_mangle]
pub extern "C" fn cuStreamWaitEvent_ptsz(s: CUstream, ev: CUevent, flags: c_uint) -> CUresult {
    cuStreamWaitEvent(per_thread(s), ev, flags)
}

#[no_mangle]
pub extern "C" fn cuEventRecord_ptsz(ev: CUevent, s: CUstream) -> CUresult {
    cuEventRecord(ev, per_thread(s))
}

#[no_mangle]
pub extern "C" fn cuEventRecordWithFlags_ptsz(ev: CUevent, s: CUstream, flags: c_uint) -> CUresult {
    cuEventRecordWithFlags(ev, per_thread(s), flags)
}

/// Runs `f` with `ctx` current on this thread (NULL: the current context), restoring the
/// thread's stack after.
fn with_context(ctx: CUcontext, f: impl FnOnce() -> CUresult) -> Result<(), CUresult> {
    if ctx.is_null() {
        return match f() {
            res::SUCCESS => Ok(()),
            e => Err(e),
        };
    }
    let h = ctx as u64;
    driver::with(|d| {
        if d.contexts.contains_key(&h) {
            Ok(())
        } else {
            Err(res::INVALID_CONTEXT)
        }
    })?;
    crate::context::push(h);
    let r = f();
    crate::context::pop();
    match r {
        res::SUCCESS => Ok(()),
        e => Err(e),
    }
}

/// `cuCtxSynchronize_v2`: waits for the work of `ctx` (NULL: the current context).
#[no_mangle]
pub extern "C" fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult {
    guard("cuCtxSynchronize_v2", || {
        with_context(ctx, || cuCtxSynchronize())
    })
}

/// `cuCtxGetDevice_v2`: the device of `ctx` (NULL: the current context).
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice_v2(dev: *mut CUdevice, ctx: CUcontext) -> CUresult {
    guard("cuCtxGetDevice_v2", || {
        // SAFETY: cuCtxGetDevice's contract.
        with_context(ctx, || unsafe { cuCtxGetDevice(dev) })
    })
}
