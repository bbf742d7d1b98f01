//! The library API (`cuLibrary*`, `cuKernel*`, CUDA 12). Loading is lazy, as the driver's
//! is by default since CUDA 12.2: `cuLibraryLoad*` keeps the image host-side and its
//! first use (a kernel's function, a launch, an attribute, a global, the module) loads it
//! on the vGPU; an image the vGPU cannot run answers `CUDA_ERROR_NO_BINARY_FOR_GPU` there.
//! `CUDA_MODULE_LOADING=EAGER` loads it when the library is created. A `CUkernel` is the
//! handle its function gets when the library loads, so it passes to `cuLaunchKernel` as a
//! `CUfunction`, as with the driver. Libraries are not bound to a context: they load with
//! none current (the runtime creates them before a program's first call).

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::{Mutex, OnceLock};

use crate::driver::{self, Driver, Res};
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

/// Whether libraries load when they are created: `CUDA_MODULE_LOADING=EAGER`, as the
/// driver reads it (any other value, or none, is lazy loading).
pub(crate) fn eager() -> bool {
    static EAGER: OnceLock<bool> = OnceLock::new();
    *EAGER.get_or_init(|| {
        std::env::var("CUDA_MODULE_LOADING").is_ok_and(|v| v.eq_ignore_ascii_case("EAGER"))
    })
}

/// Whether a load error is the image's (kept: every use answers it) rather than the
/// moment's (out of memory, too many modules: a later use tries again).
fn image_refused(e: CUresult) -> bool {
    matches!(
        e,
        res::NO_BINARY_FOR_GPU | res::INVALID_IMAGE | res::INVALID_PTX
    )
}

/// The module of library `lib`, loading it on the vGPU on its first use.
pub(crate) fn loaded(d: &mut Driver, lib: u64) -> Res<u64> {
    let l = d.extra.libraries.get(&lib).ok_or(res::INVALID_HANDLE)?;
    if let Some(m) = l.module {
        return Ok(m);
    }
    if let Some(e) = l.refused {
        return Err(e);
    }
    let img = l.image.clone().ok_or(res::INVALID_HANDLE)?;
    let r = super::module::load_image(d, img);
    if let Some(l) = d.extra.libraries.get_mut(&lib) {
        match r {
            Ok(m) => {
                l.module = Some(m);
                l.image = None;
            }
            Err(e) if image_refused(e) => {
                l.refused = Some(e);
                l.image = None;
            }
            Err(_) => {}
        }
    }
    r
}

/// Makes handle `f` usable as a function: a kernel whose library is not loaded yet is
/// loaded and looked up now. Any other handle is left to the caller's lookup.
pub(crate) fn resolve(d: &mut Driver, f: u64) -> Res<()> {
    if d.functions.contains_key(&f) {
        return Ok(());
    }
    let Some((lib, name)) = d.extra.lazy_kernels.get(&f).cloned() else {
        return Ok(());
    };
    let module = loaded(d, lib)?;
    super::module::enter_function(d, module, &name, f)?;
    d.extra.lazy_kernels.remove(&f);
    Ok(())
}

/// The kernel handle for `name` of library `lib`. A loaded library looks the function up
/// now (`CUDA_ERROR_NOT_FOUND` for a name it lacks); otherwise a PTX image's entry list
/// (or the built-in kernels) answers for it and the lookup waits for the first use; a
/// binary image's names are known once it loads.
pub(crate) fn kernel(d: &mut Driver, lib: u64, name: &str) -> Res<u64> {
    let l = d.extra.libraries.get(&lib).ok_or(res::INVALID_HANDLE)?;
    if let Some(&k) = l.kernels.get(name) {
        return Ok(k);
    }
    let known = match (l.module, &l.image) {
        (None, Some(Image::Ptx(text))) => {
            image::ptx_entries(&String::from_utf8_lossy(text)).contains_key(name)
        }
        (None, Some(Image::Builtin)) => image::builtin_signature(name).is_some(),
        _ => true,
    };
    if !known {
        return Err(res::NOT_FOUND);
    }
    let module = l.module;
    let k = d.handle();
    match module {
        Some(m) => super::module::enter_function(d, m, name, k)?,
        None => {
            d.extra.lazy_kernels.insert(k, (lib, name.to_string()));
        }
    }
    if let Some(l) = d.extra.libraries.get_mut(&lib) {
        l.kernels.insert(name.to_string(), k);
    }
    Ok(k)
}

fn load(plib: *mut CUlibrary, img: impl FnOnce(bool) -> Res<Image>) -> Res<()> {
    if plib.is_null() {
        return Err(res::INVALID_VALUE);
    }
    let native = driver::with(|d| Ok(super::module::native_binaries(d)))?;
    let (image, refused) = match img(native) {
        Ok(i) => (Some(i), None),
        // An image this vGPU cannot run fails its first use, as with the driver's lazy
        // loading; an unreadable one fails now.
        Err(e) if e == res::NO_BINARY_FOR_GPU && !eager() => (None, Some(e)),
        Err(e) => return Err(e),
    };
    let h = driver::with(|d| {
        let h = d.handle();
        d.extra.libraries.insert(
            h,
            Library {
                module: None,
                image,
                refused,
                kernels: HashMap::new(),
            },
        );
        if eager() {
            if let Err(e) = loaded(d, h) {
                d.extra.libraries.remove(&h);
                return Err(e);
            }
        }
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
    // apply: the device compiles, and the library keeps the image until it loads.
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

/// The module of library `lib`, loaded on its first use.
fn module_of(lib: CUlibrary) -> Res<u64> {
    driver::with(|d| loaded(d, lib as u64))
}

#[no_mangle]
pub extern "C" fn cuLibraryUnload(lib: CUlibrary) -> CUresult {
    guard("cuLibraryUnload", || {
        let module = driver::with(|d| {
            let l = d
                .extra
                .libraries
                .remove(&(lib as u64))
                .ok_or(res::INVALID_HANDLE)?;
            d.extra
                .lazy_kernels
                .retain(|_, (owner, _)| *owner != lib as u64);
            Ok(l.module)
        })?;
        let Some(module) = module else {
            return Ok(());
        };
        match super::module::cuModuleUnload(module as CUmodule) {
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
        let h = driver::with(|d| kernel(d, lib as u64, name))?;
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
            resolve(d, kernel as u64)?;
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
            if let Some((lib, _)) = d.extra.lazy_kernels.get(&(kernel as u64)) {
                return Ok(*lib);
            }
            let module = super::func::function(d, kernel)?.module;
            d.extra
                .libraries
                .iter()
                .find(|(_, l)| l.module == Some(module))
                .map(|(&h, _)| h)
                .ok_or(res::NOT_FOUND)
        })?;
        // SAFETY: a writable CUlibrary from the caller (NULL refused).
        unsafe { out(plib, lib as CUlibrary) }
    })
}
