//! Modules and functions. PTX text (or the PTX inside a fat binary) goes to the device,
//! which compiles it where it can (cuda backend) and refuses it where it cannot (sim
//! backend: CUDA_ERROR_NO_BINARY_FOR_GPU); the library keeps each `.entry`'s parameter
//! list to lay out launches. `vgpu:builtin` loads the vGPU's built-in kernels.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use guest_driver::Transport;

use crate::driver::{self, Alloc, Driver, Function, Module, Res};
use crate::image::{self, Image};
use crate::types::{res, CUdeviceptr, CUfunction, CUmodule, CUresult};
use crate::{guard, out};

// Function attributes live with the other function calls (api/func.rs).
pub use super::func::cuFuncGetAttribute;

pub(crate) fn load(d: &mut Driver, img: Image) -> Res<u64> {
    d.current_ctx()?;
    load_image(d, img)
}

/// Loads `img` on the vGPU: the module's handle. Modules live in the vGPU's one device
/// context, so a library loads with no context current (the runtime loads its libraries
/// before a program's first call makes one current).
pub(crate) fn load_image(d: &mut Driver, img: Image) -> Res<u64> {
    let t = d.t.clone();
    let module = match img {
        Image::Builtin => {
            let device = d.queue(0)?.call(&t, |s| s.load_builtin())?;
            Module {
                device,
                builtin: true,
                entries: HashMap::new(),
                ptx: None,
            }
        }
        Image::Ptx(bytes) => {
            let text = String::from_utf8(bytes).map_err(|_| res::INVALID_IMAGE)?;
            let entries = image::ptx_entries(&text);
            // The device reads the text from DMA memory.
            let mut region = t
                .dma_alloc(text.len().max(1), 64)
                .map_err(|_| res::OUT_OF_MEMORY)?;
            region.as_mut_slice()[..text.len()].copy_from_slice(text.as_bytes());
            let len = text.len();
            let loaded = d
                .queue(0)?
                .call(&t, |s| s.load_module_ptx(&region.as_slice()[..len]));
            // SAFETY: the load completed (or the device was reset): nothing reads the region.
            unsafe { t.dma_free(region) };
            Module {
                device: loaded?,
                builtin: false,
                entries,
                ptx: Some(text),
            }
        }
        Image::Binary(bytes) => {
            if !native_binaries(d) {
                return Err(res::NO_BINARY_FOR_GPU);
            }
            let mut region = t
                .dma_alloc(bytes.len().max(1), 64)
                .map_err(|_| res::OUT_OF_MEMORY)?;
            region.as_mut_slice()[..bytes.len()].copy_from_slice(&bytes);
            let len = bytes.len();
            let loaded = d
                .queue(0)?
                .call(&t, |s| s.load_module_binary(&region.as_slice()[..len]));
            // SAFETY: the load completed (or the device was reset): nothing reads the region.
            unsafe { t.dma_free(region) };
            // The image carries no PTX to read parameter lists from: launches lay out
            // parameters from the device's answer (see `entry_signature`).
            Module {
                device: loaded?,
                builtin: false,
                entries: HashMap::new(),
                ptx: None,
            }
        }
    };
    let h = d.handle();
    d.modules.insert(h, module);
    Ok(h)
}

/// Whether the device loads cubin and fatbin images itself.
pub(crate) fn native_binaries(d: &Driver) -> bool {
    d.info.features & vgpu_proto::features::BINARY_MODULES != 0
}

fn finish(pmod: *mut CUmodule, img: Res<Image>) -> Res<()> {
    if pmod.is_null() {
        return Err(res::INVALID_VALUE);
    }
    let h = driver::with(|d| load(d, img?))?;
    // SAFETY: checked non-null; a writable CUmodule from the caller.
    unsafe { out(pmod, h as CUmodule) }
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(pmod: *mut CUmodule, image: *const c_void) -> CUresult {
    guard("cuModuleLoadData", || {
        let native = driver::with(|d| d.current_ctx().map(|_| native_binaries(d)))?;
        // SAFETY: the image is readable as the API documents (fatbin, cubin or text).
        let img = unsafe {
            if native {
                image::read_image_native(image.cast())
            } else {
                image::read_image(image.cast())
            }
        };
        finish(pmod, img)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    pmod: *mut CUmodule,
    image: *const c_void,
    _num_options: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
) -> CUresult {
    // JIT options (log buffers, optimisation level) do not apply: the device compiles.
    // SAFETY: same contract as cuModuleLoadData.
    unsafe { cuModuleLoadData(pmod, image) }
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(pmod: *mut CUmodule, fname: *const c_char) -> CUresult {
    guard("cuModuleLoad", || {
        let native = driver::with(|d| d.current_ctx().map(|_| native_binaries(d)))?;
        if fname.is_null() {
            return Err(res::INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated file name from the caller.
        let name = unsafe { CStr::from_ptr(fname) }
            .to_string_lossy()
            .into_owned();
        let img = if name == image::BUILTIN_IMAGE {
            Ok(Image::Builtin)
        } else {
            match std::fs::read(&name) {
                Ok(bytes) if native => image::classify_native(&bytes),
                Ok(bytes) => image::classify(&bytes),
                Err(_) => Err(res::FILE_NOT_FOUND),
            }
        };
        finish(pmod, img)
    })
}

#[no_mangle]
pub extern "C" fn cuModuleUnload(hmod: CUmodule) -> CUresult {
    guard("cuModuleUnload", || {
        driver::with(|d| {
            let h = hmod as u64;
            let m = d.modules.get(&h).ok_or(res::INVALID_HANDLE)?;
            let device = m.device;
            // Kernels of the module still queued run first.
            let t = d.t.clone();
            d.drain_all();
            d.modules.remove(&h);
            d.functions.retain(|_, f| f.module != h);
            d.allocs.retain(|_, a| a.module != h);
            d.queue(0)?.call(&t, |s| s.unload_module(device))
        })
    })
}

/// Looks up function `name` of module `mh` and enters it: its handle.
pub(crate) fn get_function(d: &mut Driver, mh: u64, name: &str) -> Res<u64> {
    d.current_ctx()?;
    let h = d.handle();
    enter_function(d, mh, name, h)?;
    Ok(h)
}

/// Looks up function `name` of module `mh` on the vGPU and enters it as handle `h`.
pub(crate) fn enter_function(d: &mut Driver, mh: u64, name: &str, h: u64) -> Res<()> {
    let m = d.modules.get(&mh).ok_or(res::INVALID_HANDLE)?;
    let sig = if m.builtin {
        Some(image::builtin_signature(name).ok_or(res::NOT_FOUND)?)
    } else if m.ptx.is_some() {
        Some(m.entries.get(name).cloned().ok_or(res::NOT_FOUND)?)
    } else {
        // A binary module: the device knows its entry points.
        None
    };
    let device_module = m.device;
    let t = d.t.clone();
    // A device that reports parameter layouts also takes raw bytes.
    let layouts = d.info.features & vgpu_proto::features::PARAM_LAYOUT != 0;
    let (f, layout, attrs) = if layouts {
        let (f, layout, _, attrs) = d.queue(0)?.call(&t, |s| {
            s.get_function_layout_attributes(device_module, name)
        })?;
        (f, Some(layout), attrs)
    } else {
        let f = d
            .queue(0)?
            .call(&t, |s| s.get_function(device_module, name))?;
        (f, None, None)
    };
    let sig = match (sig, layout) {
        (Some(sig), _) => sig,
        (None, Some(layout)) => image::signature_from_layout(&layout, f.params),
        (None, None) if f.params == 0 => Vec::new(),
        (None, None) => {
            // Without PTX or the device's layout the parameters' sizes are unknown.
            crate::api::stubs::log_once(
                "kernels with parameters in cubin/fatbin modules on a protocol 1.0 device",
            );
            return Err(res::NOT_SUPPORTED);
        }
    };
    let sig = if layouts {
        image::with_raw_bytes(sig)
    } else {
        sig
    };
    if f.params != sig.len() as u64 {
        tracing::warn!(
            name,
            device = f.params,
            parsed = sig.len(),
            "parameter counts differ"
        );
    }
    d.functions.insert(
        h,
        Function {
            module: mh,
            device: f.handle,
            sig,
            name: name.to_string(),
            max_dynamic_shared: crate::api::func::default_dynamic_shared(attrs.as_ref()),
            carveout: -1,
            attrs,
            cluster: Default::default(),
        },
    );
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    pfunc: *mut CUfunction,
    hmod: CUmodule,
    name: *const c_char,
) -> CUresult {
    guard("cuModuleGetFunction", || {
        if pfunc.is_null() || name.is_null() {
            return Err(res::INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated name from the caller.
        let name = unsafe { CStr::from_ptr(name) }
            .to_str()
            .map_err(|_| res::NOT_FOUND)?;
        let h = driver::with(|d| get_function(d, hmod as u64, name))?;
        // SAFETY: checked non-null; a writable CUfunction from the caller.
        unsafe { out(pfunc, h as CUfunction) }
    })
}

/// `GET_GLOBAL` on a device with `features::GLOBALS`: the variable's address and size,
/// entered as a range of its module (a valid copy target; `cuMemFree` refuses it).
pub(crate) fn get_global(d: &mut Driver, hmod: u64, name: &str) -> Res<(u64, u64)> {
    let ctx = d.current_ctx()?;
    let m = d.modules.get(&hmod).ok_or(res::INVALID_HANDLE)?;
    if d.info.features & vgpu_proto::features::GLOBALS == 0 {
        // A device without module variables (sim, or protocol 1.1).
        let declared = m.ptx.as_deref().is_some_and(|p| {
            p.lines()
                .any(|l| l.contains(".global") && l.contains(name) && !l.contains(".entry"))
        });
        if declared {
            crate::api::stubs::log_once("cuModuleGetGlobal on a device without module variables");
            return Err(res::NOT_SUPPORTED);
        }
        return Err(res::NOT_FOUND);
    }
    // The built-in module's variables are the device's to answer (the sim's declares
    // some, a cuda device's none).
    let device = m.device;
    let t = d.t.clone();
    let (addr, size) = d.queue(0)?.call(&t, |s| s.get_global(device, name))?;
    if size > 0 && !d.allocs.contains_key(&addr) {
        let id = d.handle();
        d.allocs.insert(
            addr,
            Alloc {
                size,
                ctx,
                id,
                module: hmod,
                vmm: false,
            },
        );
    }
    Ok((addr, size))
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    hmod: CUmodule,
    name: *const c_char,
) -> CUresult {
    guard("cuModuleGetGlobal_v2", || {
        if name.is_null() {
            return Err(res::INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated name from the caller.
        let name = unsafe { CStr::from_ptr(name) }
            .to_str()
            .map_err(|_| res::NOT_FOUND)?;
        let (addr, size) = driver::with(|d| get_global(d, hmod as u64, name))?;
        // Either output may be NULL, as with the driver.
        if !dptr.is_null() {
            // SAFETY: non-null, a writable CUdeviceptr from the caller.
            unsafe { out(dptr, addr)? };
        }
        if !bytes.is_null() {
            // SAFETY: non-null, a writable size_t from the caller.
            unsafe { out(bytes, size as usize)? };
        }
        Ok(())
    })
}
