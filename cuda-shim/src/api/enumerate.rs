//! Functions of a module or library by enumeration (`cuModuleGetFunctionCount`,
//! `cuModuleEnumerateFunctions`, `cuLibraryGetKernelCount`, `cuLibraryEnumerateKernels`),
//! parameter layouts (`cuFuncGetParamInfo`, `cuKernelGetParamInfo`) and the loading
//! state of a function (a kernel of a library not loaded yet is unloaded; `cuFuncLoad`
//! loads it). The names come from the PTX's
//! `.entry` list or the built-in module's kernels; a cubin or fat binary module carries
//! no list the library can read (`CUDA_ERROR_NOT_SUPPORTED`).

use std::ffi::{c_uint, c_void};

use crate::driver::{self, Driver, Res};
use crate::image;
use crate::types::{res, CUfunction, CUmodule, CUresult};
use crate::{guard, out};

/// `CU_FUNCTION_LOADING_STATE_UNLOADED`, `CU_FUNCTION_LOADING_STATE_LOADED`.
const UNLOADED: c_uint = 0;
const LOADED: c_uint = 1;

/// The entry point names of module `m`, sorted.
fn names(d: &Driver, m: u64) -> Res<Vec<String>> {
    let module = d.modules.get(&m).ok_or(res::INVALID_HANDLE)?;
    if module.builtin {
        return Ok(vgpu_proto::builtin::KERNELS
            .iter()
            .map(|k| k.name.to_string())
            .collect());
    }
    if module.ptx.is_none() {
        crate::api::stubs::log_once("enumerating the functions of a cubin or fat binary module");
        return Err(res::NOT_SUPPORTED);
    }
    let mut names: Vec<String> = module.entries.keys().cloned().collect();
    names.sort();
    Ok(names)
}

/// Handles for up to `max` functions of module `m` (looked up once each), or of library
/// `lib` (its kernels, the same handles `cuLibraryGetKernel` answers).
fn handles(d: &mut Driver, m: u64, max: usize, lib: Option<u64>) -> Res<Vec<u64>> {
    let mut out = Vec::new();
    for name in names(d, m)?.into_iter().take(max) {
        let h = match lib {
            Some(l) => super::library::kernel(d, l, &name)?,
            None => super::module::get_function(d, m, &name)?,
        };
        out.push(h);
    }
    Ok(out)
}

/// The module of library `lib` (loaded now if it was not).
fn library_module(d: &mut Driver, lib: *mut c_void) -> Res<u64> {
    super::library::loaded(d, lib as u64)
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunctionCount(count: *mut c_uint, hmod: CUmodule) -> CUresult {
    guard("cuModuleGetFunctionCount", || {
        let n = driver::with(|d| names(d, hmod as u64).map(|n| n.len()))?;
        // SAFETY: a writable unsigned int from the caller (NULL refused).
        unsafe { out(count, n as c_uint) }
    })
}

/// Writes `hs` into `dst` (room for `room`).
///
/// # Safety
/// `dst` must hold `room` handles.
unsafe fn write_handles(dst: *mut *mut c_void, room: c_uint, hs: &[u64]) -> Res<()> {
    if dst.is_null() && room > 0 {
        return Err(res::INVALID_VALUE);
    }
    for (i, h) in hs.iter().take(room as usize).enumerate() {
        // SAFETY: `dst` holds `room` handles (caller's contract).
        unsafe { dst.add(i).write_unaligned(*h as *mut c_void) };
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleEnumerateFunctions(
    functions: *mut CUfunction,
    num: c_uint,
    hmod: CUmodule,
) -> CUresult {
    guard("cuModuleEnumerateFunctions", || {
        if functions.is_null() {
            return Err(res::INVALID_VALUE);
        }
        let hs = driver::with(|d| {
            d.current_ctx()?;
            handles(d, hmod as u64, num as usize, None)
        })?;
        // SAFETY: the caller's array of `num` handles.
        unsafe { write_handles(functions, num, &hs) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernelCount(count: *mut c_uint, lib: *mut c_void) -> CUresult {
    guard("cuLibraryGetKernelCount", || {
        let n = driver::with(|d| {
            let m = library_module(d, lib)?;
            names(d, m).map(|n| n.len())
        })?;
        // SAFETY: a writable unsigned int from the caller (NULL refused).
        unsafe { out(count, n as c_uint) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryEnumerateKernels(
    kernels: *mut *mut c_void,
    num: c_uint,
    lib: *mut c_void,
) -> CUresult {
    guard("cuLibraryEnumerateKernels", || {
        if kernels.is_null() {
            return Err(res::INVALID_VALUE);
        }
        let hs = driver::with(|d| {
            d.current_ctx()?;
            let m = library_module(d, lib)?;
            handles(d, m, num as usize, Some(lib as u64))
        })?;
        // SAFETY: the caller's array of `num` handles.
        unsafe { write_handles(kernels, num, &hs) }
    })
}

/// Parameter `index`'s offset in the parameter buffer and its size.
fn param_info(f: CUfunction, index: usize, offset: *mut usize, size: *mut usize) -> Res<()> {
    let (o, s) = driver::with(|d| {
        let func = super::func::function(d, f)?;
        let p = func.sig.get(index).ok_or(res::INVALID_VALUE)?;
        let (_, offs) = image::buffer_layout(&func.sig);
        Ok((offs.get(index).copied().unwrap_or(0), p.size))
    })?;
    // Either output may be NULL, as with the driver.
    if !offset.is_null() {
        // SAFETY: non-null, a writable size_t from the caller.
        unsafe { out(offset, o)? };
    }
    if !size.is_null() {
        // SAFETY: non-null, a writable size_t from the caller.
        unsafe { out(size, s)? };
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetParamInfo(
    f: CUfunction,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    guard("cuFuncGetParamInfo", || param_info(f, index, offset, size))
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetParamInfo(
    k: *mut c_void,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    guard("cuKernelGetParamInfo", || {
        param_info(k, index, offset, size)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncIsLoaded(state: *mut c_uint, f: CUfunction) -> CUresult {
    guard("cuFuncIsLoaded", || {
        let loaded = driver::with(|d| {
            if d.extra.lazy_kernels.contains_key(&(f as u64)) {
                return Ok(UNLOADED);
            }
            super::func::function(d, f).map(|_| LOADED)
        })?;
        // SAFETY: a writable loading state from the caller (NULL refused).
        unsafe { out(state, loaded) }
    })
}

#[no_mangle]
pub extern "C" fn cuFuncLoad(f: CUfunction) -> CUresult {
    guard("cuFuncLoad", || {
        // A kernel's library loads now; any other function is loaded with its module.
        driver::with(|d| super::func::function(d, f).map(drop))
    })
}
