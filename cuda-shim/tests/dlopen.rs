//! The library as a CUDA program sees it: `dlopen` of the built cdylib, every entry point
//! resolved through `cuGetProcAddress_v2` (as cuda-python does), against a sim
//! `vgpu-worker` over the process transport. One test: the library is one per process,
//! as libcuda is.

mod common;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::ptr::null_mut;

type R = c_uint;
type Ptr = *mut c_void;

const OK: R = 0;
const INVALID_VALUE: R = 1;
const NOT_INITIALIZED: R = 3;
const INVALID_DEVICE: R = 101;
const INVALID_IMAGE: R = 200;
const INVALID_CONTEXT: R = 201;
const NO_BINARY_FOR_GPU: R = 209;
const FILE_NOT_FOUND: R = 301;
const INVALID_HANDLE: R = 400;
const NOT_FOUND: R = 500;
const NOT_READY: R = 600;
const HOST_MEMORY_ALREADY_REGISTERED: R = 712;
const HOST_MEMORY_NOT_REGISTERED: R = 713;
const LAUNCH_FAILED: R = 719;
const NOT_SUPPORTED: R = 801;

type GetProc = unsafe extern "C" fn(*const c_char, *mut Ptr, c_int, u64, *mut c_int) -> R;

struct Cuda {
    _lib: libloading::Library,
    get_proc: GetProc,
}

impl Cuda {
    fn load() -> Cuda {
        let path = common::library();
        // SAFETY: loading our own library runs no initialisers with preconditions.
        let lib = unsafe { libloading::Library::new(&path) }.expect("dlopen libvgpu_cuda.so");
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
    fn f<F: Copy>(&self, name: &str) -> F {
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

macro_rules! call {
    ($cuda:expr, $name:literal, fn($($t:ty),*) $(, $a:expr)*) => {{
        let f: unsafe extern "C" fn($($t),*) -> R = $cuda.f($name);
        // SAFETY: the arguments match the C signature named alongside.
        unsafe { f($($a),*) }
    }};
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn a_program_drives_the_library_through_its_c_abi() {
    let worker = common::Worker::start("dlopen", "256M", 4);
    // SAFETY: set before any thread of this test reads the environment.
    unsafe { std::env::set_var("VGPU_SOCKET", &worker.socket) };
    let cu = Cuda::load();

    // Errors and names, before and without initialisation.
    let mut s: *const c_char = std::ptr::null();
    assert_eq!(
        call!(cu, "cuGetErrorName", fn(R, *mut *const c_char), 1, &mut s),
        OK
    );
    // SAFETY: the library returned a static C string.
    assert_eq!(
        unsafe { CStr::from_ptr(s) }.to_str().unwrap(),
        "CUDA_ERROR_INVALID_VALUE"
    );
    assert_eq!(
        call!(
            cu,
            "cuGetErrorString",
            fn(R, *mut *const c_char),
            700,
            &mut s
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuGetErrorName",
            fn(R, *mut *const c_char),
            12345,
            &mut s
        ),
        INVALID_VALUE
    );
    let mut n: c_int = 0;
    assert_eq!(
        call!(cu, "cuDeviceGetCount", fn(*mut c_int), &mut n),
        NOT_INITIALIZED
    );
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 1), INVALID_VALUE);
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);
    assert_eq!(call!(cu, "cuDriverGetVersion", fn(*mut c_int), &mut n), OK);
    assert_eq!(n, 13000);
    // Unknown entry points: not found; common unsupported ones: NOT_SUPPORTED.
    let mut p: Ptr = null_mut();
    let mut status = 0;
    // SAFETY: valid arguments.
    let r = unsafe { (cu.get_proc)(c"cuNoSuchThing".as_ptr(), &mut p, 13000, 0, &mut status) };
    assert_eq!((r, status, p.is_null()), (NOT_FOUND, 1, true));
    assert_eq!(
        call!(
            cu,
            "cuMemAllocManaged",
            fn(*mut u64, usize, c_uint),
            &mut 0,
            16,
            1
        ),
        NOT_SUPPORTED
    );

    // The device.
    assert_eq!(call!(cu, "cuDeviceGetCount", fn(*mut c_int), &mut n), OK);
    assert_eq!(n, 1);
    let mut dev: c_int = -1;
    assert_eq!(
        call!(cu, "cuDeviceGet", fn(*mut c_int, c_int), &mut dev, 1),
        INVALID_DEVICE
    );
    assert_eq!(
        call!(cu, "cuDeviceGet", fn(*mut c_int, c_int), &mut dev, 0),
        OK
    );
    let mut name = [0 as c_char; 64];
    assert_eq!(
        call!(
            cu,
            "cuDeviceGetName",
            fn(*mut c_char, c_int, c_int),
            name.as_mut_ptr(),
            64,
            dev
        ),
        OK
    );
    // SAFETY: NUL-terminated by the library.
    assert!(unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_str()
        .unwrap()
        .starts_with("vGPU"));
    let mut total: usize = 0;
    assert_eq!(
        call!(
            cu,
            "cuDeviceTotalMem",
            fn(*mut usize, c_int),
            &mut total,
            dev
        ),
        OK
    );
    assert_eq!(total, 256 << 20);
    let attr = |a: c_int| {
        let mut v: c_int = -1;
        let r = call!(
            cu,
            "cuDeviceGetAttribute",
            fn(*mut c_int, c_int, c_int),
            &mut v,
            a,
            0
        );
        (r, v)
    };
    assert_eq!(attr(10), (OK, 32)); // WARP_SIZE
    assert_eq!(attr(75), (OK, 9)); // COMPUTE_CAPABILITY_MAJOR
    assert_eq!(attr(1), (OK, 1024)); // MAX_THREADS_PER_BLOCK
    assert!(attr(16).1 >= 1); // MULTIPROCESSOR_COUNT
    assert_eq!(attr(9999).0, INVALID_VALUE);
    let mut uuid = [0u8; 16];
    assert_eq!(
        call!(
            cu,
            "cuDeviceGetUuid",
            fn(*mut u8, c_int),
            uuid.as_mut_ptr(),
            dev
        ),
        OK
    );
    assert_eq!(&uuid[..4], b"vGPU");

    // Contexts.
    let mut d: u64 = 0;
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), &mut d, 16),
        INVALID_CONTEXT
    );
    let mut primary: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuDevicePrimaryCtxRetain",
            fn(*mut Ptr, c_int),
            &mut primary,
            dev
        ),
        OK
    );
    assert_eq!(call!(cu, "cuCtxSetCurrent", fn(Ptr), primary), OK);
    let mut cur: Ptr = null_mut();
    assert_eq!(call!(cu, "cuCtxGetCurrent", fn(*mut Ptr), &mut cur), OK);
    assert_eq!(cur, primary);
    let mut ctx: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuCtxCreate",
            fn(*mut Ptr, Ptr, c_uint, c_int),
            &mut ctx,
            null_mut(),
            0,
            dev
        ),
        OK
    );
    assert_eq!(call!(cu, "cuCtxGetCurrent", fn(*mut Ptr), &mut cur), OK);
    assert_eq!(cur, ctx);
    let mut scratch: u64 = 0;
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), &mut scratch, 4096),
        OK
    );
    assert_eq!(call!(cu, "cuCtxPopCurrent", fn(*mut Ptr), &mut cur), OK);
    assert_eq!(cur, ctx);
    assert_eq!(call!(cu, "cuCtxPushCurrent", fn(Ptr), ctx), OK);
    assert_eq!(call!(cu, "cuCtxSynchronize", fn()), OK);
    assert_eq!(call!(cu, "cuCtxDestroy", fn(Ptr), ctx), OK);
    assert_eq!(call!(cu, "cuCtxDestroy", fn(Ptr), ctx), INVALID_CONTEXT);
    assert_eq!(call!(cu, "cuCtxDestroy", fn(Ptr), primary), INVALID_CONTEXT);
    assert_eq!(
        call!(cu, "cuCtxPushCurrent", fn(Ptr), 0xdead0 as Ptr),
        INVALID_CONTEXT
    );
    assert_eq!(call!(cu, "cuCtxGetCurrent", fn(*mut Ptr), &mut cur), OK);
    assert_eq!(cur, primary, "destroying a context takes it off the stack");
    // The destroyed context's allocation went with it.
    assert_eq!(call!(cu, "cuMemFree", fn(u64), scratch), INVALID_VALUE);

    // Memory and synchronous copies (pageable host memory bounces).
    let n_el = 1usize << 16;
    let bytes = n_el * 4;
    let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
    for p in [&mut a, &mut b, &mut c] {
        assert_eq!(call!(cu, "cuMemAlloc", fn(*mut u64, usize), p, bytes), OK);
    }
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), &mut d, 0),
        INVALID_VALUE
    );
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), null_mut(), 16),
        INVALID_VALUE
    );
    let (mut free, mut tot) = (0usize, 0usize);
    assert_eq!(
        call!(
            cu,
            "cuMemGetInfo",
            fn(*mut usize, *mut usize),
            &mut free,
            &mut tot
        ),
        OK
    );
    assert_eq!(tot, 256 << 20);
    assert!(free <= tot - 3 * bytes);
    let ha: Vec<f32> = (0..n_el).map(|i| i as f32).collect();
    let hb: Vec<f32> = (0..n_el).map(|i| 2.0 * i as f32).collect();
    assert_eq!(
        call!(
            cu,
            "cuMemcpyHtoD",
            fn(u64, *const c_void, usize),
            a,
            ha.as_ptr().cast(),
            bytes
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyHtoD",
            fn(u64, *const c_void, usize),
            b,
            hb.as_ptr().cast(),
            bytes
        ),
        OK
    );
    let mut back = vec![0u8; bytes];
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            back.as_mut_ptr().cast(),
            a,
            bytes
        ),
        OK
    );
    assert_eq!(floats(&back), ha);
    // Out of bounds, NULL host pointers.
    assert_eq!(
        call!(
            cu,
            "cuMemcpyHtoD",
            fn(u64, *const c_void, usize),
            a + 8,
            ha.as_ptr().cast(),
            bytes
        ),
        INVALID_VALUE
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyHtoD",
            fn(u64, *const c_void, usize),
            a,
            std::ptr::null(),
            4
        ),
        INVALID_VALUE
    );

    // A copy larger than the staging buffer, there and back.
    let big_len = (6 << 20) + 12;
    let mut big_dev = 0u64;
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), &mut big_dev, big_len),
        OK
    );
    let big: Vec<u8> = (0..big_len).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(
        call!(
            cu,
            "cuMemcpyHtoD",
            fn(u64, *const c_void, usize),
            big_dev,
            big.as_ptr().cast(),
            big_len
        ),
        OK
    );
    let mut big_back = vec![0u8; big_len];
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            big_back.as_mut_ptr().cast(),
            big_dev,
            big_len
        ),
        OK
    );
    assert!(big == big_back);
    assert_eq!(call!(cu, "cuMemFree", fn(u64), big_dev), OK);

    // Memsets.
    assert_eq!(
        call!(cu, "cuMemsetD8", fn(u64, u8, usize), c, 0xab, bytes),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            back.as_mut_ptr().cast(),
            c,
            bytes
        ),
        OK
    );
    assert!(back.iter().all(|&x| x == 0xab));
    assert_eq!(
        call!(cu, "cuMemsetD16", fn(u64, u16, usize), c, 0x1234, n_el * 2),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            back.as_mut_ptr().cast(),
            c,
            4
        ),
        OK
    );
    assert_eq!(&back[..4], &[0x34, 0x12, 0x34, 0x12]);
    assert_eq!(
        call!(cu, "cuMemsetD32", fn(u64, u32, usize), c, 0xdead_beef, n_el),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            back.as_mut_ptr().cast(),
            c,
            4
        ),
        OK
    );
    assert_eq!(
        u32::from_le_bytes([back[0], back[1], back[2], back[3]]),
        0xdead_beef
    );
    assert_eq!(
        call!(cu, "cuMemsetD16", fn(u64, u16, usize), c + 1, 1, 4),
        INVALID_VALUE
    );
    assert_eq!(
        call!(cu, "cuMemsetD32", fn(u64, u32, usize), c, 1, n_el + 1),
        INVALID_VALUE
    );
    // Device to device.
    assert_eq!(
        call!(cu, "cuMemcpyDtoD", fn(u64, u64, usize), c, a, bytes),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            back.as_mut_ptr().cast(),
            c,
            bytes
        ),
        OK
    );
    assert_eq!(floats(&back), ha);

    // Pinned host memory from the DMA pool: zero-copy, and pointer attributes.
    let mut pinned: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuMemAllocHost",
            fn(*mut Ptr, usize),
            &mut pinned,
            bytes
        ),
        OK
    );
    let mut mt: c_uint = 0;
    assert_eq!(
        call!(
            cu,
            "cuPointerGetAttribute",
            fn(*mut c_void, c_int, u64),
            (&mut mt as *mut c_uint).cast(),
            2,
            pinned as u64
        ),
        OK
    );
    assert_eq!(mt, 1, "host memory");
    assert_eq!(
        call!(
            cu,
            "cuPointerGetAttribute",
            fn(*mut c_void, c_int, u64),
            (&mut mt as *mut c_uint).cast(),
            2,
            a + 100
        ),
        OK
    );
    assert_eq!(mt, 2, "device memory");
    let mut start = 0u64;
    assert_eq!(
        call!(
            cu,
            "cuPointerGetAttribute",
            fn(*mut c_void, c_int, u64),
            (&mut start as *mut u64).cast(),
            11,
            a + 100
        ),
        OK
    );
    assert_eq!(start, a);
    assert_eq!(
        call!(
            cu,
            "cuPointerGetAttribute",
            fn(*mut c_void, c_int, u64),
            (&mut mt as *mut c_uint).cast(),
            2,
            0x10
        ),
        INVALID_VALUE
    );
    assert_eq!(
        call!(
            cu,
            "cuMemHostGetDevicePointer",
            fn(*mut u64, Ptr, c_uint),
            &mut d,
            pinned,
            0
        ),
        NOT_SUPPORTED
    );

    // Registered (pageable) memory.
    let mut reg = vec![0u8; 8192];
    let regp: Ptr = reg.as_mut_ptr().cast();
    assert_eq!(
        call!(
            cu,
            "cuMemHostRegister",
            fn(Ptr, usize, c_uint),
            regp,
            8192,
            0
        ),
        OK
    );
    assert_eq!(
        call!(cu, "cuMemHostRegister", fn(Ptr, usize, c_uint), regp, 16, 0),
        HOST_MEMORY_ALREADY_REGISTERED
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            regp,
            a,
            8192
        ),
        OK
    );
    assert_eq!(floats(&reg[..16]), [0.0, 1.0, 2.0, 3.0]);
    assert_eq!(call!(cu, "cuMemHostUnregister", fn(Ptr), regp), OK);
    assert_eq!(
        call!(cu, "cuMemHostUnregister", fn(Ptr), regp),
        HOST_MEMORY_NOT_REGISTERED
    );

    // Streams, built-in kernels, asynchronous copies.
    let (mut s1, mut s2): (Ptr, Ptr) = (null_mut(), null_mut());
    assert_eq!(
        call!(cu, "cuStreamCreate", fn(*mut Ptr, c_uint), &mut s1, 0),
        OK
    );
    assert_eq!(
        call!(cu, "cuStreamCreate", fn(*mut Ptr, c_uint), &mut s2, 1),
        OK
    );
    let mut module: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuModuleLoadData",
            fn(*mut Ptr, *const c_void),
            &mut module,
            c"vgpu:builtin".as_ptr().cast()
        ),
        OK
    );
    let mut vadd: Ptr = null_mut();
    let mut saxpy: Ptr = null_mut();
    let mut spin: Ptr = null_mut();
    let mut gather: Ptr = null_mut();
    let get_fn = |out: &mut Ptr, name: &CStr| {
        call!(
            cu,
            "cuModuleGetFunction",
            fn(*mut Ptr, Ptr, *const c_char),
            out,
            module,
            name.as_ptr()
        )
    };
    assert_eq!(get_fn(&mut vadd, c"vector_add"), OK);
    assert_eq!(get_fn(&mut saxpy, c"saxpy"), OK);
    assert_eq!(get_fn(&mut spin, c"spin"), OK);
    assert_eq!(get_fn(&mut gather, c"gather"), OK);
    let mut none: Ptr = null_mut();
    assert_eq!(get_fn(&mut none, c"no_such_kernel"), NOT_FOUND);

    macro_rules! launch {
        ($f:expr, $grid:expr, $block:expr, $stream:expr, $params:expr, $extra:expr) => {
            call!(
                cu,
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
                $f,
                $grid,
                1,
                1,
                $block,
                1,
                1,
                0,
                $stream,
                $params,
                $extra
            )
        };
    }
    // vector_add with kernelParams: c = a + b.
    let mut n64 = n_el as u64;
    let mut params: [Ptr; 4] = [
        (&mut a as *mut u64).cast(),
        (&mut b as *mut u64).cast(),
        (&mut c as *mut u64).cast(),
        (&mut n64 as *mut u64).cast(),
    ];
    assert_eq!(
        launch!(vadd, 256, 256, s1, params.as_mut_ptr(), null_mut()),
        OK
    );
    // saxpy with a parameter buffer: y (= b) = 0.5 * x (= a) + y.
    #[repr(C)]
    struct SaxpyArgs {
        alpha: f32,
        _pad: u32,
        x: u64,
        y: u64,
        n: u64,
    }
    let mut args = SaxpyArgs {
        alpha: 0.5,
        _pad: 0,
        x: a,
        y: b,
        n: n_el as u64,
    };
    let mut size = std::mem::size_of::<SaxpyArgs>();
    let mut extra: [Ptr; 5] = [
        1 as Ptr,
        (&mut args as *mut SaxpyArgs).cast(),
        2 as Ptr,
        (&mut size as *mut usize).cast(),
        null_mut(),
    ];
    assert_eq!(
        launch!(saxpy, 256, 256, s2, null_mut(), extra.as_mut_ptr()),
        OK
    );
    // Bad launches.
    let mut small = 8usize;
    let mut short: [Ptr; 5] = [
        1 as Ptr,
        (&mut args as *mut SaxpyArgs).cast(),
        2 as Ptr,
        (&mut small as *mut usize).cast(),
        null_mut(),
    ];
    assert_eq!(
        launch!(saxpy, 1, 32, s2, null_mut(), short.as_mut_ptr()),
        INVALID_VALUE
    );
    assert_eq!(
        launch!(vadd, 1, 2048, s1, params.as_mut_ptr(), null_mut()),
        INVALID_VALUE
    );
    assert_eq!(
        launch!(vadd, 0, 32, s1, params.as_mut_ptr(), null_mut()),
        INVALID_VALUE
    );
    assert_eq!(
        launch!(vadd, 1, 32, s1, params.as_mut_ptr(), extra.as_mut_ptr()),
        INVALID_VALUE
    );
    assert_eq!(
        launch!(0x777770 as Ptr, 1, 32, s1, params.as_mut_ptr(), null_mut()),
        INVALID_HANDLE
    );
    assert_eq!(
        launch!(vadd, 1, 32, 0x55550 as Ptr, params.as_mut_ptr(), null_mut()),
        INVALID_HANDLE
    );

    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s1), OK);
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s2), OK);
    // Asynchronous copies into pinned memory, then the host reads it.
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoHAsync",
            fn(*mut c_void, u64, usize, Ptr),
            pinned,
            c,
            bytes,
            s1
        ),
        OK
    );
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s1), OK);
    // SAFETY: `bytes` bytes of pinned memory the device finished writing.
    let got = floats(unsafe { std::slice::from_raw_parts(pinned.cast::<u8>(), bytes) });
    assert!(
        got.iter().enumerate().all(|(i, &v)| v == 3.0 * i as f32),
        "vector_add"
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoHAsync",
            fn(*mut c_void, u64, usize, Ptr),
            pinned,
            b,
            bytes,
            s2
        ),
        OK
    );
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s2), OK);
    // SAFETY: as above.
    let got = floats(unsafe { std::slice::from_raw_parts(pinned.cast::<u8>(), bytes) });
    assert!(
        got.iter().enumerate().all(|(i, &v)| v == 2.5 * i as f32),
        "saxpy"
    );
    // Asynchronous memsets and copies from pageable memory, many per doorbell.
    for v in 1..=5u32 {
        assert_eq!(
            call!(
                cu,
                "cuMemsetD32Async",
                fn(u64, u32, usize, Ptr),
                c,
                v,
                n_el,
                s1
            ),
            OK
        );
    }
    assert_eq!(
        call!(
            cu,
            "cuMemcpyHtoDAsync",
            fn(u64, *const c_void, usize, Ptr),
            a,
            hb.as_ptr().cast(),
            bytes,
            s1
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoDAsync",
            fn(u64, u64, usize, Ptr),
            b,
            a,
            bytes,
            s1
        ),
        OK
    );
    assert_eq!(
        call!(cu, "cuMemsetD8Async", fn(u64, u8, usize, Ptr), a, 0, 4, s1),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemsetD16Async",
            fn(u64, u16, usize, Ptr),
            a,
            0,
            2,
            s1
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            back.as_mut_ptr().cast(),
            b,
            bytes
        ),
        OK
    );
    assert_eq!(
        floats(&back),
        hb,
        "the default stream waits for blocking streams"
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            back.as_mut_ptr().cast(),
            c,
            4
        ),
        OK
    );
    assert_eq!(u32::from_le_bytes([back[0], back[1], back[2], back[3]]), 5);

    // Events.
    let (mut e0, mut e1, mut e2): (Ptr, Ptr, Ptr) = (null_mut(), null_mut(), null_mut());
    assert_eq!(
        call!(cu, "cuEventCreate", fn(*mut Ptr, c_uint), &mut e0, 0),
        OK
    );
    assert_eq!(
        call!(cu, "cuEventCreate", fn(*mut Ptr, c_uint), &mut e1, 0),
        OK
    );
    assert_eq!(
        call!(cu, "cuEventCreate", fn(*mut Ptr, c_uint), &mut e2, 2),
        OK
    );
    assert_eq!(call!(cu, "cuEventQuery", fn(Ptr), e0), OK, "never recorded");
    assert_eq!(call!(cu, "cuEventRecord", fn(Ptr, Ptr), e0, s1), OK);
    let mut us = 30_000u64;
    let mut sp: [Ptr; 1] = [(&mut us as *mut u64).cast()];
    assert_eq!(launch!(spin, 1, 1, s1, sp.as_mut_ptr(), null_mut()), OK);
    assert_eq!(call!(cu, "cuEventRecord", fn(Ptr, Ptr), e1, s1), OK);
    assert_eq!(call!(cu, "cuEventRecord", fn(Ptr, Ptr), e2, s1), OK);
    assert_eq!(call!(cu, "cuEventQuery", fn(Ptr), e1), NOT_READY);
    assert_eq!(call!(cu, "cuStreamQuery", fn(Ptr), s1), NOT_READY);
    let mut ms: f32 = 0.0;
    assert_eq!(
        call!(
            cu,
            "cuEventElapsedTime",
            fn(*mut f32, Ptr, Ptr),
            &mut ms,
            e0,
            e1
        ),
        NOT_READY
    );
    assert_eq!(
        call!(cu, "cuStreamWaitEvent", fn(Ptr, Ptr, c_uint), s2, e1, 0),
        OK
    );
    assert_eq!(
        call!(cu, "cuEventQuery", fn(Ptr), e1),
        OK,
        "s2 waited for e1"
    );
    assert_eq!(call!(cu, "cuEventSynchronize", fn(Ptr), e2), OK);
    assert_eq!(
        call!(
            cu,
            "cuEventElapsedTime",
            fn(*mut f32, Ptr, Ptr),
            &mut ms,
            e0,
            e1
        ),
        OK
    );
    assert!(ms >= 25.0, "elapsed {ms} ms around a 30 ms kernel");
    assert_eq!(
        call!(
            cu,
            "cuEventElapsedTime",
            fn(*mut f32, Ptr, Ptr),
            &mut ms,
            e0,
            e2
        ),
        INVALID_HANDLE,
        "timing disabled"
    );
    assert_eq!(call!(cu, "cuStreamQuery", fn(Ptr), s1), OK);
    for e in [e0, e1, e2] {
        assert_eq!(call!(cu, "cuEventDestroy", fn(Ptr), e), OK);
    }
    assert_eq!(call!(cu, "cuEventDestroy", fn(Ptr), e0), INVALID_HANDLE);
    assert_eq!(
        call!(cu, "cuEventRecord", fn(Ptr, Ptr), e0, s1),
        INVALID_HANDLE
    );

    // A kernel fault is reported by the next synchronising call, as CUDA reports it.
    let mut idx = 0u64;
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), &mut idx, 16),
        OK
    );
    assert_eq!(
        call!(cu, "cuMemsetD32", fn(u64, u32, usize), idx, 1_000_000, 4),
        OK
    );
    let (mut four, mut src_len) = (4u64, 16u64);
    let mut gp: [Ptr; 5] = [
        (&mut a as *mut u64).cast(),
        (&mut idx as *mut u64).cast(),
        (&mut c as *mut u64).cast(),
        (&mut four as *mut u64).cast(),
        (&mut src_len as *mut u64).cast(),
    ];
    assert_eq!(launch!(gather, 1, 32, s2, gp.as_mut_ptr(), null_mut()), OK);
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s2), LAUNCH_FAILED);
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s2), OK);

    // Modules the sim cannot run, and images that are not modules.
    let ptx = c".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k(.param .u64 p)\n{\n ret;\n}\n";
    let mut m2: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuModuleLoadData",
            fn(*mut Ptr, *const c_void),
            &mut m2,
            ptx.as_ptr().cast()
        ),
        NO_BINARY_FOR_GPU
    );
    assert_eq!(
        call!(
            cu,
            "cuModuleLoadData",
            fn(*mut Ptr, *const c_void),
            &mut m2,
            c"garbage".as_ptr().cast()
        ),
        INVALID_IMAGE
    );
    assert_eq!(
        call!(
            cu,
            "cuModuleLoadData",
            fn(*mut Ptr, *const c_void),
            &mut m2,
            b"\x7fELF\x02\x01\x01\0".as_ptr().cast()
        ),
        NO_BINARY_FOR_GPU
    );
    assert_eq!(
        call!(
            cu,
            "cuModuleLoad",
            fn(*mut Ptr, *const c_char),
            &mut m2,
            c"/no/such/file.ptx".as_ptr()
        ),
        FILE_NOT_FOUND
    );
    assert_eq!(call!(cu, "cuModuleUnload", fn(Ptr), module), OK);
    assert_eq!(call!(cu, "cuModuleUnload", fn(Ptr), module), INVALID_HANDLE);
    assert_eq!(
        launch!(vadd, 1, 32, s1, params.as_mut_ptr(), null_mut()),
        INVALID_HANDLE,
        "function of an unloaded module"
    );

    // Freed pointers.
    assert_eq!(call!(cu, "cuMemFree", fn(u64), a), OK);
    assert_eq!(call!(cu, "cuMemFree", fn(u64), a), INVALID_VALUE);
    assert_eq!(
        call!(
            cu,
            "cuMemcpyHtoD",
            fn(u64, *const c_void, usize),
            a,
            ha.as_ptr().cast(),
            4
        ),
        INVALID_VALUE
    );
    assert_eq!(
        call!(cu, "cuMemsetD8", fn(u64, u8, usize), a, 0, 1),
        INVALID_VALUE
    );

    for s in [s1, s2] {
        assert_eq!(call!(cu, "cuStreamDestroy", fn(Ptr), s), OK);
    }
    assert_eq!(call!(cu, "cuStreamDestroy", fn(Ptr), s1), INVALID_HANDLE);
    assert_eq!(
        call!(cu, "cuStreamSynchronize", fn(Ptr), s1),
        INVALID_HANDLE
    );
    for p in [b, c, idx] {
        assert_eq!(call!(cu, "cuMemFree", fn(u64), p), OK);
    }
    assert_eq!(call!(cu, "cuMemFreeHost", fn(Ptr), pinned), OK);
    assert_eq!(call!(cu, "cuMemFreeHost", fn(Ptr), pinned), INVALID_VALUE);
    assert_eq!(call!(cu, "cuCtxSynchronize", fn()), OK);
    assert_eq!(call!(cu, "cuDevicePrimaryCtxRelease", fn(c_int), dev), OK);
    drop(worker);
}
