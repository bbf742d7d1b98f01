//! The library API (`cuLibrary*`, `cuKernel*`, CUDA 12): a library is a module loaded
//! eagerly in the vGPU's one context (the image is compiled or loaded when
//! `cuLibraryLoad*` returns), a kernel is its function: a `CUkernel` is the handle of
//! the function, so it passes to `cuLaunchKernel` as a `CUfunction`, as with the driver.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::Mutex;

use crate::driver::{self, Res};
use crate::extra::Library;
use crate::image::{self, Image};
use crate::types::{res, CUdeviceptr, CUfunction, CUmodule, CUresult};
use crate::{guard, out};

pub type CUlibrary = *mut c_void;
pub type CUkernel = *mut c_void;

/// A C string for `name` that lives as long as the program (names are interned once).
pub(crate) fn name_ptr(name: &str) -> *const c_char {
    static NAMES: Mutex<Option<HashSet<&'static CStr>>> = Mutex::new(None);
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let set = names.get_or_insert_with(HashSet::new);
    let c = CString::new(name).unwrap_or_default();
    if let Some(found) = set.get(c.as_c_str()) {
        return found.as_ptr();
    }
    let leaked: &'static CStr = Box::leak(c.into_boxed_c_str());
    set.insert(leaked);
    leaked.as_ptr()
}

fn load(plib: *mut CUlibrary, img: impl FnOnce(bool) -> Res<Image>) -> Res<()> {
    if plib.is_null() {
        return Err(res::INVALID_VALUE);
    }
    let native = driver::with(|d| d.current_ctx().map(|_| super::module::native_binaries(d)))?;
    let img = img(native)?;
    let h = driver::with(|d| {
        let module = super::module::load(d, img)?;
        let h = d.handle();
        d.extra.libraries.insert(
            h,
            Library {
                module,
                kernels: HashMap::new(),
            },
        );
        Ok(h)
    })?;
    // SAFETY: checked non-null; a writable CUlibrary from the caller.
    unsafe { out(plib, h as CUlibrary) }
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLibraryLoadData(
    plib: *mut CUlibrary,
    code: *const c_void,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    _lib_options: *mut c_int,
    _lib_values: *mut *mut c_void,
    _num_lib: c_uint,
) -> CUresult {
    // JIT and library options (log buffers, optimisation, binary preservation) do not
    // apply: the device compiles, and loading is eager.
    guard("cuLibraryLoadData", || {
        load(plib, |native| {
            // SAFETY: the image is readable as the API documents (fatbin, cubin or text).
            unsafe {
                if native {
                    image::read_image_native(code.cast())
                } else {
                    image::read_image(code.cast())
                }
            }
        })
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    plib: *mut CUlibrary,
    file: *const c_char,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    _lib_options: *mut c_int,
    _lib_values: *mut *mut c_void,
    _num_lib: c_uint,
) -> CUresult {
    guard("cuLibraryLoadFromFile", || {
        if file.is_null() {
            return Err(res::INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated file name from the caller.
        let name = unsafe { CStr::from_ptr(file) }
            .to_string_lossy()
            .into_owned();
        load(plib, |native| {
            if name == image::BUILTIN_IMAGE {
                return Ok(Image::Builtin);
            }
            match std::fs::read(&name) {
                Ok(bytes) if native => image::classify_native(&bytes),
                Ok(bytes) => image::classify(&bytes),
                Err(_) => Err(res::FILE_NOT_FOUND),
            }
        })
    })
}

fn module_of(lib: CUlibrary) -> Res<u64> {
    driver::with(|d| {
        d.extra
            .libraries
            .get(&(lib as u64))
            .map(|l| l.module)
            .ok_or(res::INVALID_HANDLE)
    })
}

#[no_mangle]
pub extern "C" fn cuLibraryUnload(lib: CUlibrary) -> CUresult {
    guard("cuLibraryUnload", || {
        let module = module_of(lib)?;
        let r = super::module::cuModuleUnload(module as CUmodule);
        driver::with(|d| {
            d.extra.libraries.remove(&(lib as u64));
            Ok(())
        })?;
        match r {
            res::SUCCESS => Ok(()),
            e => Err(e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernel(
    pkernel: *mut CUkernel,
    lib: CUlibrary,
    name: *const c_char,
) -> CUresult {
    guard("cuLibraryGetKernel", || {
        if pkernel.is_null() || name.is_null() {
            return Err(res::INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated name from the caller.
        let name = unsafe { CStr::from_ptr(name) }
            .to_str()
            .map_err(|_| res::NOT_FOUND)?;
        let h = driver::with(|d| {
            let l = d
                .extra
                .libraries
                .get(&(lib as u64))
                .ok_or(res::INVALID_HANDLE)?;
            if let Some(&k) = l.kernels.get(name) {
                return Ok(k);
            }
            let module = l.module;
            let k = super::module::get_function(d, module, name)?;
            if let Some(l) = d.extra.libraries.get_mut(&(lib as u64)) {
                l.kernels.insert(name.to_string(), k);
            }
            Ok(k)
        })?;
        // SAFETY: checked non-null; a writable CUkernel from the caller.
        unsafe { out(pkernel, h as CUkernel) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetModule(pmod: *mut CUmodule, lib: CUlibrary) -> CUresult {
    guard("cuLibraryGetModule", || {
        let m = module_of(lib)?;
        // SAFETY: a writable CUmodule from the caller (NULL refused).
        unsafe { out(pmod, m as CUmodule) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetGlobal(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    lib: CUlibrary,
    name: *const c_char,
) -> CUresult {
    guard("cuLibraryGetGlobal", || {
        let m = module_of(lib)?;
        // SAFETY: the caller's pointers, as cuModuleGetGlobal takes them.
        match unsafe { super::module::cuModuleGetGlobal_v2(dptr, bytes, m as CUmodule, name) } {
            res::SUCCESS => Ok(()),
            e => Err(e),
        }
    })
}

/// A kernel's device argument must be the vGPU's one device.
fn check_device(dev: c_int) -> Res<()> {
    if dev == 0 {
        Ok(())
    } else {
        Err(res::INVALID_DEVICE)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetFunction(pfunc: *mut CUfunction, kernel: CUkernel) -> CUresult {
    guard("cuKernelGetFunction", || {
        driver::with(|d| {
            d.current_ctx()?;
            super::func::function(d, kernel).map(drop)
        })?;
        // SAFETY: a writable CUfunction from the caller (NULL refused).
        unsafe { out(pfunc, kernel as CUfunction) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    kernel: CUkernel,
    dev: c_int,
) -> CUresult {
    guard("cuKernelGetAttribute", || {
        let v = driver::with(|d| {
            check_device(dev)?;
            super::func::get_attribute(d, kernel, attrib)
        })?;
        // SAFETY: a writable int from the caller (NULL refused).
        unsafe { out(pi, v) }
    })
}

#[no_mangle]
pub extern "C" fn cuKernelSetAttribute(
    attrib: c_int,
    value: c_int,
    kernel: CUkernel,
    dev: c_int,
) -> CUresult {
    guard("cuKernelSetAttribute", || {
        driver::with(|d| {
            check_device(dev)?;
            super::func::set_attribute(d, kernel, attrib, value)
        })
    })
}

#[no_mangle]
pub extern "C" fn cuKernelSetCacheConfig(kernel: CUkernel, config: c_int, dev: c_int) -> CUresult {
    guard("cuKernelSetCacheConfig", || {
        check_device(dev)?;
        match super::func::cuFuncSetCacheConfig(kernel, config) {
            res::SUCCESS => Ok(()),
            e => Err(e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetName(name: *mut *const c_char, kernel: CUkernel) -> CUresult {
    // SAFETY: the caller's pointer, as cuFuncGetName takes it.
    unsafe { super::func::cuFuncGetName(name, kernel) }
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetLibrary(plib: *mut CUlibrary, kernel: CUkernel) -> CUresult {
    guard("cuKernelGetLibrary", || {
        let lib = driver::with(|d| {
            let module = super::func::function(d, kernel)?.module;
            d.extra
                .libraries
                .iter()
                .find(|(_, l)| l.module == module)
                .map(|(&h, _)| h)
                .ok_or(res::NOT_FOUND)
        })?;
        // SAFETY: a writable CUlibrary from the caller (NULL refused).
        unsafe { out(plib, lib as CUlibrary) }
    })
}
