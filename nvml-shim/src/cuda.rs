//! The vGPU CUDA library (`libcuda.so.1` from `vgpu-cuda`), through which this library
//! reaches the vGPU. A process vGPU's worker serves one connection, the CUDA library's;
//! a second connection would find the worker taken (docs/nvml.md). So NVML asks the CUDA
//! library of this process, by its driver API and two vGPU-private functions
//! (`vgpuCudaProbe`, `vgpuCudaMemory`), and its answers are by construction what CUDA
//! answers.
//!
//! Which `libcuda.so.1`: the one this process already loaded, else the one beside this
//! library (where `vgpu-cuda install` puts both), else the loader's by name. It is never
//! unloaded.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::OnceLock;

use crate::types::{ret, NvmlReturn};

/// `CUresult`.
pub type CuResult = c_int;
/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: CuResult = 0;
const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
const CUDA_ERROR_NOT_INITIALIZED: CuResult = 3;
const CUDA_ERROR_DEVICE_UNAVAILABLE: CuResult = 46;
const CUDA_ERROR_NO_DEVICE: CuResult = 100;
const CUDA_ERROR_NOT_SUPPORTED: CuResult = 801;

/// `CUdevice_attribute` values the library asks for.
pub mod attr {
    pub const PCI_BUS_ID: i32 = 33;
    pub const PCI_DEVICE_ID: i32 = 34;
    pub const COMPUTE_MODE: i32 = 20;
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
    pub const PCI_DOMAIN_ID: i32 = 50;
}

/// The functions of the vGPU CUDA library this library calls.
pub struct Cuda {
    /// Where it was found, for logs.
    pub path: String,
    pub init: unsafe extern "C" fn(c_uint) -> CuResult,
    pub probe: unsafe extern "C" fn(*mut c_char, usize) -> CuResult,
    pub memory: unsafe extern "C" fn(*mut u64, *mut u64, *mut c_int) -> CuResult,
    pub driver_version: unsafe extern "C" fn(*mut c_int) -> CuResult,
    pub name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult,
    pub uuid: unsafe extern "C" fn(*mut [u8; 16], c_int) -> CuResult,
    pub attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CuResult,
}

/// The library once found; never unloaded.
static CUDA: OnceLock<Cuda> = OnceLock::new();

/// The directory this library was loaded from.
fn own_dir() -> Option<String> {
    let mut info: libc::Dl_info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    let here = own_dir as *const c_void;
    // SAFETY: `here` is an address inside this library; `info` is a valid out struct.
    if unsafe { libc::dladdr(here, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr set dli_fname to a NUL-terminated path the loader owns.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_str().ok()?;
    let dir = std::path::Path::new(path).parent()?;
    Some(dir.to_str()?.to_owned())
}

/// `dlopen(name, RTLD_NOW | extra)`; NULL when it fails.
fn open(name: &str, extra: c_int) -> *mut c_void {
    let Ok(c) = CString::new(name) else {
        return std::ptr::null_mut();
    };
    // SAFETY: a NUL-terminated name; loading libcuda runs its initialisers, which have no
    // preconditions.
    unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL | extra) }
}

/// The symbol `name` of `handle` as a function pointer `F`.
///
/// # Safety
/// `F` must be the C signature of `name` (a function pointer type).
unsafe fn symbol<F: Copy>(handle: *mut c_void, name: &CStr) -> Option<F> {
    // SAFETY: a live handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: the caller names the symbol's C signature as F, a function pointer.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

/// Resolves every function the library needs from `handle`; `None` when one is missing
/// (not the vGPU CUDA library).
fn resolve(handle: *mut c_void, path: String) -> Option<Cuda> {
    // SAFETY: each type below is the C signature of the symbol named beside it.
    unsafe {
        Some(Cuda {
            path,
            init: symbol(handle, c"cuInit")?,
            probe: symbol(handle, c"vgpuCudaProbe")?,
            memory: symbol(handle, c"vgpuCudaMemory")?,
            driver_version: symbol(handle, c"cuDriverGetVersion")?,
            name: symbol(handle, c"cuDeviceGetName")?,
            uuid: symbol(handle, c"cuDeviceGetUuid_v2")?,
            attribute: symbol(handle, c"cuDeviceGetAttribute")?,
        })
    }
}

/// The vGPU CUDA library, loaded on first use; the error says where it looked.
pub fn load() -> Result<&'static Cuda, String> {
    if let Some(c) = CUDA.get() {
        return Ok(c);
    }
    let mut tried = Vec::new();
    let sibling = own_dir().map(|d| format!("{d}/libcuda.so.1"));
    let candidates = [
        ("libcuda.so.1".to_owned(), libc::RTLD_NOLOAD),
        (sibling.unwrap_or_default(), 0),
        ("libcuda.so.1".to_owned(), 0),
    ];
    for (name, flags) in candidates {
        if name.is_empty() {
            continue;
        }
        let handle = open(&name, flags);
        if handle.is_null() {
            if flags == 0 {
                tried.push(format!("{name} (not found)"));
            }
            continue;
        }
        match resolve(handle, name.clone()) {
            Some(c) => return Ok(CUDA.get_or_init(|| c)),
            None => tried.push(format!("{name} (not the vGPU CUDA library)")),
        }
    }
    Err(format!(
        "the vGPU CUDA library (libcuda.so.1 from vgpu-cuda) was not found: tried {}; \
         install both with `vgpu-cuda install` and put their directory on LD_LIBRARY_PATH \
         (docs/nvml.md)",
        tried.join(", ")
    ))
}

/// The library, once `load` succeeded.
pub fn loaded() -> Option<&'static Cuda> {
    CUDA.get()
}

/// NVML's answer for a CUDA result.
pub fn to_nvml(r: CuResult) -> NvmlReturn {
    match r {
        CUDA_SUCCESS => ret::SUCCESS,
        CUDA_ERROR_INVALID_VALUE => ret::INVALID_ARGUMENT,
        CUDA_ERROR_NOT_INITIALIZED => ret::UNINITIALIZED,
        CUDA_ERROR_NOT_SUPPORTED => ret::NOT_SUPPORTED,
        // The worker could not be reached, or hung up: the vGPU is inaccessible.
        CUDA_ERROR_NO_DEVICE | CUDA_ERROR_DEVICE_UNAVAILABLE => ret::GPU_IS_LOST,
        _ => ret::UNKNOWN,
    }
}

/// `Err` with NVML's answer unless `r` is CUDA_SUCCESS.
pub fn check(r: CuResult) -> Result<(), NvmlReturn> {
    match r {
        CUDA_SUCCESS => Ok(()),
        e => Err(to_nvml(e)),
    }
}

impl Cuda {
    /// Opens the vGPU through the CUDA library (`cuInit`: connects to the worker on the
    /// first call in the process, as the program's own `cuInit` would, and shares that one
    /// connection with it).
    pub fn open(&self) -> Result<(), NvmlReturn> {
        // SAFETY: cuInit(0) has no pointer arguments.
        let r = unsafe { (self.init)(0) };
        // Once: a monitoring loop asks again and again, and the answer does not change.
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if r != CUDA_SUCCESS && !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(
                library = self.path,
                code = r,
                "the vGPU cannot be reached (the CUDA library's message says why): \
                 answering NVML_ERROR_GPU_IS_LOST"
            );
        }
        check(r)
    }

    /// A device attribute (`cuDeviceGetAttribute` of device 0).
    pub fn attribute(&self, a: c_int) -> Result<c_int, NvmlReturn> {
        self.open()?;
        let mut v = 0;
        // SAFETY: a valid out int, device 0.
        check(unsafe { (self.attribute)(&mut v, a, 0) })?;
        Ok(v)
    }

    /// The device's name, as `cuDeviceGetName` answers it.
    pub fn device_name(&self) -> Result<String, NvmlReturn> {
        self.open()?;
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer holds its length in bytes; device 0.
        check(unsafe { (self.name)(buf.as_mut_ptr(), buf.len() as c_int, 0) })?;
        // SAFETY: cuDeviceGetName NUL-terminates within the buffer.
        let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
        Ok(s.to_string_lossy().into_owned())
    }

    /// The device's UUID, as `cuDeviceGetUuid_v2` answers it.
    pub fn device_uuid(&self) -> Result<[u8; 16], NvmlReturn> {
        self.open()?;
        let mut u = [0u8; 16];
        // SAFETY: a valid out CUuuid (16 bytes); device 0.
        check(unsafe { (self.uuid)(&mut u, 0) })?;
        Ok(u)
    }

    /// The vGPU's memory share and use, and whether this process holds a context on it.
    pub fn memory(&self) -> Result<(u64, u64, bool), NvmlReturn> {
        self.open()?;
        self.memory_if_open()
    }

    /// As `memory`, without opening the vGPU: `UNINITIALIZED` when this process has not.
    pub fn memory_if_open(&self) -> Result<(u64, u64, bool), NvmlReturn> {
        let (mut share, mut used, mut holds) = (0u64, 0u64, 0 as c_int);
        // SAFETY: three valid out values.
        check(unsafe { (self.memory)(&mut share, &mut used, &mut holds) })?;
        Ok((share, used, holds != 0))
    }

    /// The CUDA version the library speaks (`cuDriverGetVersion`).
    pub fn cuda_version(&self) -> Result<c_int, NvmlReturn> {
        let mut v = 0;
        // SAFETY: a valid out int.
        check(unsafe { (self.driver_version)(&mut v) })?;
        Ok(v)
    }

    /// Whether this process has a vGPU, without connecting to it; the reason when not.
    pub fn probe(&self) -> Result<(), String> {
        let mut why = [0 as c_char; 1024];
        // SAFETY: the buffer holds its length in bytes.
        let r = unsafe { (self.probe)(why.as_mut_ptr(), why.len()) };
        if r == CUDA_SUCCESS {
            return Ok(());
        }
        // SAFETY: vgpuCudaProbe NUL-terminates within the buffer.
        let s = unsafe { CStr::from_ptr(why.as_ptr()) };
        Err(s.to_string_lossy().into_owned())
    }
}
