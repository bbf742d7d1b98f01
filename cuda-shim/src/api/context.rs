//! Primary and explicit contexts. Every context of the process shares the one vGPU (one
//! device address space); a context owns the allocations made while it was current, and
//! destroying it frees them.

use std::ffi::{c_int, c_uint, c_void};

use super::device::check_dev;
use crate::context as stack;
use crate::driver::{self, Context, Driver, Res};
use crate::types::{res, CUcontext, CUdevice, CUresult, DRIVER_VERSION};
use crate::{guard, out};

fn live(d: &Driver, ctx: CUcontext) -> Res<u64> {
    let h = ctx as u64;
    if d.contexts.contains_key(&h) {
        Ok(h)
    } else {
        Err(res::INVALID_CONTEXT)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard("cuDevicePrimaryCtxRetain", || {
        if pctx.is_null() {
            return Err(res::INVALID_VALUE);
        }
        let h = driver::with(|d| {
            check_dev(dev)?;
            d.primary_refs += 1;
            Ok(d.primary)
        })?;
        // SAFETY: checked non-null; a writable CUcontext from the caller.
        unsafe { out(pctx, h as CUcontext) }
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    guard("cuDevicePrimaryCtxRelease_v2", || {
        driver::with(|d| {
            check_dev(dev)?;
            if d.primary_refs == 0 {
                return Err(res::INVALID_CONTEXT);
            }
            d.primary_refs -= 1;
            Ok(())
        })
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    guard("cuDevicePrimaryCtxReset_v2", || {
        let primary = driver::with(|d| {
            check_dev(dev)?;
            let _ = d.sync_all();
            let primary = d.primary;
            super::memory::free_context_allocations(d, primary);
            d.primary_refs = 0;
            Ok(primary)
        })?;
        // The runtime's per-context state goes with the context's memory.
        super::export::context_destroyed(primary);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    guard("cuDevicePrimaryCtxGetState", || {
        let (f, a) = driver::with(|d| {
            check_dev(dev)?;
            let f = d.contexts.get(&d.primary).map_or(0, |c| c.flags);
            Ok((f, c_int::from(d.primary_refs > 0)))
        })?;
        if flags.is_null() || active.is_null() {
            return Err(res::INVALID_VALUE);
        }
        // SAFETY: both checked non-null; writable from the caller.
        unsafe {
            out(flags, f)?;
            out(active, a)
        }
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    guard("cuDevicePrimaryCtxSetFlags_v2", || {
        driver::with(|d| {
            check_dev(dev)?;
            let p = d.primary;
            if let Some(c) = d.contexts.get_mut(&p) {
                c.flags = flags;
            }
            Ok(())
        })
    })
}

fn create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> Res<()> {
    if pctx.is_null() {
        return Err(res::INVALID_VALUE);
    }
    let h = driver::with(|d| {
        check_dev(dev)?;
        let h = d.handle();
        d.contexts.insert(
            h,
            Context {
                primary: false,
                flags,
            },
        );
        Ok(h)
    })?;
    stack::push(h);
    // SAFETY: checked non-null; a writable CUcontext from the caller.
    unsafe { out(pctx, h as CUcontext) }
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard("cuCtxCreate_v2", || create(pctx, flags, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut c_void,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard("cuCtxCreate_v3", || {
        if num_params != 0 || !params.is_null() {
            crate::api::stubs::log_once("cuCtxCreate_v3 with execution affinity");
            return Err(res::NOT_SUPPORTED);
        }
        create(pctx, flags, dev)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard("cuCtxCreate_v4", || {
        if !params.is_null() {
            crate::api::stubs::log_once("cuCtxCreate_v4 with creation parameters");
            return Err(res::NOT_SUPPORTED);
        }
        create(pctx, flags, dev)
    })
}

#[no_mangle]
pub extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    guard("cuCtxDestroy_v2", || {
        let h = driver::with(|d| {
            let h = live(d, ctx)?;
            if d.contexts.get(&h).is_some_and(|c| c.primary) {
                return Err(res::INVALID_CONTEXT);
            }
            let _ = d.sync_all();
            super::memory::free_context_allocations(d, h);
            d.streams.retain(|_, s| s.ctx != h);
            d.contexts.remove(&h);
            Ok(h)
        })?;
        stack::forget(h);
        super::export::context_destroyed(h);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    guard("cuCtxSetCurrent", || {
        if ctx.is_null() {
            driver::with(|_| Ok(()))?;
            stack::set(None);
            return Ok(());
        }
        let h = driver::with(|d| live(d, ctx))?;
        stack::set(Some(h));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    guard("cuCtxGetCurrent", || {
        driver::with(|_| Ok(()))?;
        let h = stack::current().unwrap_or(0);
        // SAFETY: a writable CUcontext from the caller.
        unsafe { out(pctx, h as CUcontext) }
    })
}

#[no_mangle]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    guard("cuCtxPushCurrent_v2", || {
        let h = driver::with(|d| live(d, ctx))?;
        stack::push(h);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    guard("cuCtxPopCurrent_v2", || {
        driver::with(|_| Ok(()))?;
        let h = stack::pop().ok_or(res::INVALID_CONTEXT)?;
        if !pctx.is_null() {
            // SAFETY: non-null; a writable CUcontext from the caller.
            unsafe { out(pctx, h as CUcontext)? };
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    guard("cuCtxSynchronize", || {
        driver::wait_outside(
            |d| {
                d.current_ctx()?;
                crate::api::capture::sync_check(d, 0)?;
                Ok(d.shared_queues())
            },
            |t, queues| driver::sync_queues(t, &queues),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    guard("cuCtxGetDevice", || {
        driver::with(|d| d.current_ctx().map(drop))?;
        // SAFETY: a writable CUdevice from the caller.
        unsafe { out(dev, 0) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) -> CUresult {
    guard("cuCtxGetApiVersion", || {
        driver::with(|d| {
            if ctx.is_null() {
                d.current_ctx().map(drop)
            } else {
                live(d, ctx).map(drop)
            }
        })?;
        // SAFETY: a writable unsigned int from the caller.
        unsafe { out(version, DRIVER_VERSION as c_uint) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    guard("cuCtxGetFlags", || {
        let f = driver::with(|d| {
            let h = d.current_ctx()?;
            Ok(d.contexts.get(&h).map_or(0, |c| c.flags))
        })?;
        // SAFETY: a writable unsigned int from the caller.
        unsafe { out(flags, f) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetId(ctx: CUcontext, id: *mut u64) -> CUresult {
    guard("cuCtxGetId", || {
        let h = driver::with(|d| {
            if ctx.is_null() {
                d.current_ctx()
            } else {
                live(d, ctx)
            }
        })?;
        // SAFETY: a writable u64 from the caller.
        unsafe { out(id, h) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    guard("cuCtxGetStreamPriorityRange", || {
        driver::with(|d| d.current_ctx().map(drop))?;
        if !least.is_null() {
            // SAFETY: non-null, writable from the caller.
            unsafe { out(least, 0)? };
        }
        if !greatest.is_null() {
            // SAFETY: non-null, writable from the caller.
            unsafe { out(greatest, 0)? };
        }
        Ok(())
    })
}

// The unversioned names the real libcuda also exports for these, with the same
// signatures (programs that look symbols up by hand find either).

#[no_mangle]
pub extern "C" fn cuCtxDestroy(ctx: CUcontext) -> CUresult {
    cuCtxDestroy_v2(ctx)
}

#[no_mangle]
pub extern "C" fn cuCtxPushCurrent(ctx: CUcontext) -> CUresult {
    cuCtxPushCurrent_v2(ctx)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent(pctx: *mut CUcontext) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuCtxPopCurrent_v2(pctx) }
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    cuDevicePrimaryCtxRelease_v2(dev)
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    cuDevicePrimaryCtxReset_v2(dev)
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) -> CUresult {
    cuDevicePrimaryCtxSetFlags_v2(dev, flags)
}
