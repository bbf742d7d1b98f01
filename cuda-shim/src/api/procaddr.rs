//! `cuGetProcAddress`: the entry point by base name (`cuMemAlloc` -> `cuMemAlloc_v2`), as
//! cuda-python and CUDA 12+ loaders resolve the driver API, from the table of entry points
//! (`table.rs`).

use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Mutex;

#[cfg(test)]
use super::{context::*, launch::*, memory::*, stream::*};
use crate::types::{
    res, CUresult, CU_GET_PROC_ADDRESS_SUCCESS, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
};
use crate::{guard, out};

/// `CU_GET_PROC_ADDRESS_*` flags.
const FLAG_LEGACY_STREAM: u64 = 1 << 0;
const FLAG_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

/// What `cuGetProcAddress` finds for a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    Function(usize),
    /// The name exists from a later CUDA version than the one asked for.
    VersionNotSufficient,
    NotFound,
}

/// The function for `symbol` at CUDA version `version` with `cuGetProcAddress`'s `flags`,
/// from the table of entry points (`table.rs`).
pub fn lookup(symbol: &str, version: c_int, flags: u64) -> Found {
    let Some(entry) = super::table::find(symbol) else {
        return Found::NotFound;
    };
    let variants = if flags & FLAG_PER_THREAD_DEFAULT_STREAM != 0 && !entry.per_thread.is_empty() {
        entry.per_thread
    } else {
        entry.versions
    };
    variants
        .iter()
        .filter(|v| v.since <= version)
        .max_by_key(|v| v.since)
        .map_or(Found::VersionNotSufficient, |v| {
            Found::Function(v.symbol.address.get())
        })
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
