//! The library loaded the way a CUDA program's loader loads it: `dlopen` of the built
//! cdylib, every entry point resolved through `cuGetProcAddress_v2` (as cuda-python does).

#![allow(dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::ptr::null_mut;

pub type R = c_uint;
pub type Ptr = *mut c_void;

pub const OK: R = 0;
pub const INVALID_VALUE: R = 1;
pub const NOT_INITIALIZED: R = 3;
pub const INVALID_DEVICE: R = 101;
pub const INVALID_IMAGE: R = 200;
pub const INVALID_CONTEXT: R = 201;
pub const NO_BINARY_FOR_GPU: R = 209;
pub const FILE_NOT_FOUND: R = 301;
pub const INVALID_HANDLE: R = 400;
pub const NOT_FOUND: R = 500;
pub const NOT_READY: R = 600;
pub const HOST_MEMORY_ALREADY_REGISTERED: R = 712;
pub const HOST_MEMORY_NOT_REGISTERED: R = 713;
pub const LAUNCH_FAILED: R = 719;
pub const NOT_SUPPORTED: R = 801;

pub type GetProc = unsafe extern "C" fn(*const c_char, *mut Ptr, c_int, u64, *mut c_int) -> R;

pub struct Cuda {
    _lib: libloading::Library,
    pub get_proc: GetProc,
}

impl Cuda {
    pub fn load() -> Cuda {
        Self::load_from(&super::library())
    }

    /// The library at `path` (a prebuilt one, where no cargo can build it).
    pub fn load_from(path: &std::path::Path) -> Cuda {
        // SAFETY: loading our own library runs no initialisers with preconditions.
        let lib = unsafe { libloading::Library::new(path) }.expect("dlopen libvgpu_cuda.so");
        // SAFETY: cuGetProcAddress_v2 has exactly this C signature.
        let get_proc = unsafe {
            *lib.get::<GetProc>(b"cuGetProcAddress_v2\0")
                .expect("symbol")
        };
        Cuda {
            _lib: lib,
            get_proc,
        }
    }

    /// The entry point `name` (base name, CUDA 13.0) as an `F`.
    pub fn f<F: Copy>(&self, name: &str) -> F {
        let c = std::ffi::CString::new(name).unwrap();
        let mut p: Ptr = null_mut();
        let mut status = -1;
        // SAFETY: valid name, out pointers.
        let r = unsafe { (self.get_proc)(c.as_ptr(), &mut p, 13000, 0, &mut status) };
        assert_eq!((r, status), (OK, 0), "cuGetProcAddress({name})");
        assert!(!p.is_null());
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<Ptr>());
        // SAFETY: the caller names the C signature of `name` as F (a fn pointer type).
        unsafe { std::mem::transmute_copy(&p) }
    }
}

impl Cuda {
    /// Retains device `dev`'s primary context and makes it current: the set-up of most
    /// tests.
    pub fn primary_context(&self, dev: c_int) -> Ptr {
        let mut ctx: Ptr = null_mut();
        let retain: unsafe extern "C" fn(*mut Ptr, c_int) -> R = self.f("cuDevicePrimaryCtxRetain");
        let set: unsafe extern "C" fn(Ptr) -> R = self.f("cuCtxSetCurrent");
        // SAFETY: the C signatures of the two functions; a valid out pointer.
        unsafe {
            assert_eq!(retain(&mut ctx, dev), OK);
            assert_eq!(set(ctx), OK);
        }
        ctx
    }

    /// Device 0's attribute `attr` (`cuDeviceGetAttribute`, which must succeed).
    #[allow(dead_code)] // not every test binary asks
    pub fn device_attribute(&self, attr: c_int) -> c_int {
        let f: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> R = self.f("cuDeviceGetAttribute");
        let mut v: c_int = -1;
        // SAFETY: its C signature; a valid out pointer.
        assert_eq!(unsafe { f(&mut v, attr, 0) }, OK, "attribute {attr}");
        v
    }

    /// Blocks of `block` threads with `shared` bytes of dynamic shared memory each that
    /// one SM holds (`cuOccupancyMaxActiveBlocksPerMultiprocessor`, which must succeed).
    #[allow(dead_code)] // not every test binary asks
    pub fn blocks_per_sm(&self, func: Ptr, block: c_int, shared: usize) -> c_int {
        let f: unsafe extern "C" fn(*mut c_int, Ptr, c_int, usize) -> R =
            self.f("cuOccupancyMaxActiveBlocksPerMultiprocessor");
        let mut n: c_int = -1;
        // SAFETY: its C signature; a valid out pointer; the library checks the handle.
        assert_eq!(unsafe { f(&mut n, func, block, shared) }, OK);
        n
    }

    /// `cuStreamSynchronize(s)`.
    pub fn sync(&self, s: Ptr) -> R {
        let f: unsafe extern "C" fn(Ptr) -> R = self.f("cuStreamSynchronize");
        // SAFETY: its C signature; any handle is checked by the library.
        unsafe { f(s) }
    }
}

#[macro_export]
macro_rules! call {
    ($cuda:expr, $name:literal, fn($($t:ty),* $(,)?) $(, $a:expr)* $(,)?) => {{
        let f: unsafe extern "C" fn($($t),*) -> R = $cuda.f($name);
        // SAFETY: the arguments match the C signature named alongside.
        #[allow(clippy::macro_metavars_in_unsafe)]
        unsafe { f($($a),*) }
    }};
}

/// Calls of the tests' common shapes (after `call!`, which they use).
impl Cuda {
    /// `cuLaunchKernel` of `func` on a one-dimensional grid of one-dimensional blocks, no
    /// dynamic shared memory, with `kernelParams` `params` (the caller keeps what they
    /// point to alive for the call).
    pub fn launch_1d(
        &self,
        func: Ptr,
        grid: c_uint,
        block: c_uint,
        stream: Ptr,
        params: &mut [Ptr],
    ) -> R {
        call!(
            self,
            "cuLaunchKernel",
            fn(
                Ptr,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                Ptr,
                *mut Ptr,
                *mut Ptr,
            ),
            func,
            grid,
            1,
            1,
            block,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            null_mut()
        )
    }

    /// The built-in kernels' module (`cuModuleLoadData` of `vgpu:builtin`).
    pub fn builtin_module(&self) -> Ptr {
        let mut module: Ptr = null_mut();
        assert_eq!(
            call!(
                self,
                "cuModuleLoadData",
                fn(*mut Ptr, *const c_void),
                &mut module,
                c"vgpu:builtin".as_ptr().cast()
            ),
            OK
        );
        module
    }

    /// `cuModuleGetFunction` of `name` in `module`, which must succeed.
    pub fn function(&self, module: Ptr, name: &CStr) -> Ptr {
        let mut f: Ptr = null_mut();
        let rc = call!(
            self,
            "cuModuleGetFunction",
            fn(*mut Ptr, Ptr, *const c_char),
            &mut f,
            module,
            name.as_ptr()
        );
        assert_eq!(rc, OK, "{name:?}");
        f
    }

    /// `cuMemcpyDtoH` of `dst.len()` bytes from `src`.
    pub fn dtoh(&self, dst: &mut [u8], src: u64) -> R {
        call!(
            self,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            dst.as_mut_ptr().cast(),
            src,
            dst.len()
        )
    }
}

pub fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A sim worker for this test process and the library connected to it (`VGPU_SOCKET`),
/// not yet initialised.
pub fn start(name: &str) -> (super::Worker, Cuda) {
    let worker = super::Worker::sim(name, "256M", 4);
    // SAFETY: set before the library reads the environment, while this test is the only
    // thread that touches it.
    unsafe { std::env::set_var("VGPU_SOCKET", &worker.socket) };
    (worker, Cuda::load())
}

/// `CUlaunchAttribute` as the library takes it.
#[repr(C)]
pub struct LaunchAttribute {
    pub id: c_uint,
    pub pad: [u8; 4],
    pub value: [u32; 16],
}

/// `CUlaunchConfig` as the library takes it.
#[repr(C)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared: c_uint,
    pub stream: Ptr,
    pub attrs: *const LaunchAttribute,
    pub num_attrs: c_uint,
}

impl Cuda {
    /// `cuOccupancyMaxActiveClusters` (`active`) or `cuOccupancyMaxPotentialClusterSize`
    /// of `func` for `cfg`: the result code and the count (-1 when unset).
    pub fn cluster_occupancy(&self, func: Ptr, active: bool, cfg: &LaunchConfig) -> (R, c_int) {
        let mut n: c_int = -1;
        let rc = if active {
            call!(
                self,
                "cuOccupancyMaxActiveClusters",
                fn(*mut c_int, Ptr, *const LaunchConfig),
                &mut n,
                func,
                cfg
            )
        } else {
            call!(
                self,
                "cuOccupancyMaxPotentialClusterSize",
                fn(*mut c_int, Ptr, *const LaunchConfig),
                &mut n,
                func,
                cfg
            )
        };
        (rc, n)
    }
}
